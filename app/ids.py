"""Public object ids in OpenAI's shapes (`file-…`, `batch_…`, `upload_…`, `part_…`) and
Anthropic's Message Batch ids (`msgbatch_…`)."""

import secrets
import string

from app.core.states import BatchApi

_ALPHABET = string.ascii_letters + string.digits
MESSAGE_BATCH_PREFIX = "msgbatch_"


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_file_id() -> str:
    return new_id("file-")


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def new_message_batch_id() -> str:
    return new_id(MESSAGE_BATCH_PREFIX)


def batch_api_of(batch_id: str) -> BatchApi:
    """The API a batch was created through, as its id tells: for clients that only see
    OpenAI's batch object, which both kinds are shown as on `/v1/batches`."""
    return BatchApi.ANTHROPIC if batch_id.startswith(MESSAGE_BATCH_PREFIX) else BatchApi.OPENAI


def new_upload_id() -> str:
    return new_id("upload_")


def new_part_id() -> str:
    return new_id("part_")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


def new_batch_request_id() -> str:
    return "batch_req_" + secrets.token_hex(16)
