"""OpenAI's error envelope as an HTTP response: for the API's handlers and middlewares and the
worker's online server alike."""

from starlette.responses import JSONResponse

from app.errors import OpenAIError


def error_response(error: OpenAIError) -> JSONResponse:
    headers = dict(error.headers)
    # The SDK retries 409 and 5xx by default; a client error will not change on retry.
    if 400 <= error.status_code < 500 and error.status_code not in (408, 429):
        headers.setdefault("x-should-retry", "false")
    return JSONResponse(error.body(), status_code=error.status_code, headers=headers)
