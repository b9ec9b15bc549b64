"""The worker: runs batch requests on an embedded vLLM engine (`overnight worker`).

claim (leases) → reader (shard input) → scheduler (in-flight window) → engine (vLLM) →
writer (result chunks) → shard (checkpoints, cancel/expiry) → loop (the process), which
runs finalization (`app.services.steps`). `process` makes engine processes die with the worker.
"""
