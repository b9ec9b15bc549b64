"""The endpoints a batch line can target, named once for the API, the worker and the CLI."""

CHAT = "/v1/chat/completions"
# Anthropic's Messages API, answered by vLLM's Anthropic serving class.
MESSAGES = "/v1/messages"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
SCORE = "/v1/score"
RERANK = "/v1/rerank"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"

# What the worker executes; OpenAI's other batch endpoints are refused at create.
SUPPORTED = (
    RESPONSES,
    CHAT,
    COMPLETIONS,
    MESSAGES,
    EMBEDDINGS,
    SCORE,
    RERANK,
    TRANSCRIPTIONS,
    TRANSLATIONS,
)
# What a generative (text-out) model answers; a pooling model POOLING, a speech model SPEECH.
GENERATIVE = [CHAT, COMPLETIONS, RESPONSES, MESSAGES]
POOLING = [EMBEDDINGS, SCORE, RERANK]
SPEECH = [TRANSCRIPTIONS, TRANSLATIONS]

# vLLM's own server answers these at the bare paths too (and rerank at /v2/rerank).
_ALIASES = {"/score": SCORE, "/rerank": RERANK, "/v2/rerank": RERANK}


def canonical(url: str) -> str:
    """The endpoint a url names: `/score` is `/v1/score`, as in vLLM's server."""
    return _ALIASES.get(url, url)
