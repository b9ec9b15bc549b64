"""Anthropic's Message Batches wire shapes (`anthropic.types.messages`), kept apart from ORM rows.

Timestamps are RFC 3339 strings, as Anthropic sends them; ids are `msgbatch_…`.
"""

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_REQUESTS = 100_000
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 1000


class ProcessingStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    CANCELING = "canceling"
    ENDED = "ended"


class ResultType(StrEnum):
    SUCCEEDED = "succeeded"
    ERRORED = "errored"
    CANCELED = "canceled"
    EXPIRED = "expired"


class MessageBatchRequest(BaseModel):
    """One inline request: `params` is a non-streaming Messages request, checked as a line."""

    model_config = ConfigDict(extra="ignore")

    custom_id: str = Field(pattern=CUSTOM_ID_PATTERN)
    params: dict[str, Any]


class CreateMessageBatchRequest(BaseModel):
    """`POST /v1/messages/batches`."""

    model_config = ConfigDict(extra="ignore")

    requests: list[MessageBatchRequest] = Field(min_length=1, max_length=MAX_REQUESTS)


class MessageBatchRequestCounts(BaseModel):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: ProcessingStatus
    request_counts: MessageBatchRequestCounts
    created_at: str
    expires_at: str
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = None


class MessageBatchPage(BaseModel):
    """Anthropic's list page: newest first, with the ids at both ends for the next cursor."""

    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class AnthropicErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    REQUEST_TOO_LARGE = "request_too_large"
    RATE_LIMIT = "rate_limit_error"
    API = "api_error"
    OVERLOADED = "overloaded_error"

    @classmethod
    def of_status(cls, status_code: int) -> "AnthropicErrorType":
        """The type Anthropic sends with `status_code`."""
        return _BY_STATUS.get(status_code, cls.API if status_code >= 500 else cls.INVALID_REQUEST)


_BY_STATUS = {
    401: AnthropicErrorType.AUTHENTICATION,
    403: AnthropicErrorType.PERMISSION,
    404: AnthropicErrorType.NOT_FOUND,
    413: AnthropicErrorType.REQUEST_TOO_LARGE,
    429: AnthropicErrorType.RATE_LIMIT,
    529: AnthropicErrorType.OVERLOADED,
}


# Where Anthropic's routes are: they answer errors in Anthropic's envelope.
ANTHROPIC_PATHS = "/v1/messages/batches"


def anthropic_error(status_code: int, message: str) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`: a response's body, or a result's."""
    kind = AnthropicErrorType.of_status(status_code)
    return {"type": "error", "error": {"type": str(kind), "message": message}}
