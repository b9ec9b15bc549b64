"""Wire shapes of the Batches API, with OpenAI's names (`openai.types.Batch`)."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.core.states import BatchStatus
from app.schemas.common import ExpiresAfter, RequestModel, inline_enum


class CreateBatchRequest(RequestModel):
    """`POST /v1/batches`; `endpoint` and `completion_window` are checked by the service."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    # Expiry of the output and error files, anchored at their creation.
    output_expires_after: ExpiresAfter | None = None


class RetryBatchRequest(RequestModel):
    """Ours: `POST /v1/batches/{id}/retry`."""

    all: bool = Field(
        False, description="Also retry requests the engine refused (4xx), not only 5xx and unrun."
    )


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0
    # Ours: how many of `failed` never ran because the batch was cancelled or expired.
    cancelled: int = 0
    expired: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int = 0


class BatchObject(BaseModel):
    """The Batch object; every key is always present, unset ones as `null`."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Annotated[BatchStatus, inline_enum(BatchStatus, "Status")]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    usage: BatchUsage
    metadata: dict[str, Any] | None


class BatchResultsPage(BaseModel):
    """Ours: `GET /v1/batches/{id}/results`, the result lines recorded so far.

    `data` holds output and error file lines as they are (or will be) in the files; pass
    `last_id` as `after` to read on. `complete` is false while the batch runs; `restarted`
    says a cursor taken while it ran was answered from the start of its final files.
    """

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    has_more: bool
    last_id: str
    complete: bool
    restarted: bool = False
