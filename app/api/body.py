"""JSON request bodies read whatever the Content-Type says.

OpenAI's own curl examples post JSON with curl's default form Content-Type, and
the SDK sends `Content-Type: application/json` with an empty body on bodiless POSTs.
"""

from typing import Any, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.errors import OpenAIError, validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)


async def read_json(request: Request, model: type[ModelT]) -> ModelT:
    raw = await request.body()
    try:
        data: Any = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise OpenAIError(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None
    if not isinstance(data, dict):
        raise OpenAIError("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` that documents a body read with `read_json`."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
