"""The OpenAI endpoints a batch line can target, named once for the API, the worker and the CLI."""

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"

# What the worker executes; OpenAI's other batch endpoints are refused at create.
SUPPORTED = (RESPONSES, CHAT, COMPLETIONS, EMBEDDINGS)
# What a generative (text-out) model answers; a pooling model answers EMBEDDINGS.
GENERATIVE = [CHAT, COMPLETIONS, RESPONSES]
