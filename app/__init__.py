"""overnight: a self-hosted OpenAI Batch API on an embedded vLLM engine."""
