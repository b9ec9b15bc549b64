"""Public object ids in OpenAI's shapes: `file-…`, `batch_…`, `upload_…`, `part_…`."""

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_file_id() -> str:
    return new_id("file-")


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def new_upload_id() -> str:
    return new_id("upload_")


def new_part_id() -> str:
    return new_id("part_")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


def new_batch_request_id() -> str:
    return "batch_req_" + secrets.token_hex(16)
