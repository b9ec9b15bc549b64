"""A Message Batch's results: its output and error files, line by line in Anthropic's shape.

Each OpenAI result line `{custom_id, response, error}` becomes `{custom_id, result}` with
`result` one of `succeeded` (the Messages body), `errored` (Anthropic's error object),
`canceled` or `expired`. A batch that ended before any request ran has no such files: its
input lines are answered with how it ended.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.db.models import File
from app.errors import OpenAIError
from app.schemas.message_batches import ResultType, anthropic_error
from app.services.jsonl import iter_lines
from app.services.message_batches import find
from app.storage import Storage

_UNRUN = {"batch_cancelled": ResultType.CANCELED, "batch_expired": ResultType.EXPIRED}
_ENDED_UNRUN = {BatchStatus.CANCELLED: ResultType.CANCELED, BatchStatus.EXPIRED: ResultType.EXPIRED}


@dataclass(frozen=True)
class ResultSource:
    """Where an ended batch's results are: its result files, else its input file."""

    result_keys: list[str]
    input_key: str | None = None
    # For a batch answered from its input: how every request ended, and why, by line.
    unrun: ResultType = ResultType.ERRORED
    line_errors: dict[int, str] = field(default_factory=dict)
    failure: str = "The batch failed validation."


def open_results(session: Session, project_id: str, batch_id: str) -> ResultSource:
    batch = find(session, project_id, batch_id)
    if batch.status not in TERMINAL_BATCH_STATUSES:
        raise OpenAIError(
            f"Message Batch {batch_id} has not ended yet: its results are available once "
            "its processing_status is 'ended'."
        )
    file_ids = [i for i in (batch.output_file_id, batch.error_file_id) if i is not None]
    if file_ids:
        found = session.execute(select(File.id, File.storage_key).where(File.id.in_(file_ids)))
        keys = {file_id: key for file_id, key in found}
        return ResultSource([keys[i] for i in file_ids if keys.get(i)])
    errors = batch.errors or []
    input_key = session.scalar(select(File.storage_key).where(File.id == batch.input_file_id))
    return ResultSource(
        [],
        input_key=input_key or None,
        unrun=_ENDED_UNRUN.get(batch.status, ResultType.ERRORED),
        line_errors={e["line"]: e["message"] for e in errors if e.get("line") is not None},
        failure=errors[0]["message"] if errors else ResultSource.failure,
    )


def result_lines(storage: Storage, source: ResultSource) -> Iterator[bytes]:
    """The results JSONL, streamed: nothing is held but the line being converted."""
    for key in source.result_keys:
        for _line_no, raw in iter_lines(storage, key):
            line = orjson.loads(raw)
            yield _jsonl(line["custom_id"], result_of(line))
    if source.input_key is not None:
        for line_no, raw in iter_lines(storage, source.input_key):
            custom_id = _custom_id(raw)
            if custom_id is not None:
                yield _jsonl(custom_id, _unrun_result(source, line_no))


def result_of(line: dict[str, Any]) -> dict[str, Any]:
    """The `result` of one OpenAI output or error line."""
    response = line.get("response") or {}
    error = line.get("error") or {}
    status = int(response.get("status_code") or 500)
    if 200 <= status < 300:
        return {"type": ResultType.SUCCEEDED, "message": response.get("body")}
    unrun = _UNRUN.get(str(error.get("code")))
    if unrun is not None:
        return {"type": unrun}
    body_error = (response.get("body") or {}).get("error") or {}
    message = body_error.get("message") or error.get("message") or "The request failed."
    return {"type": ResultType.ERRORED, "error": anthropic_error(status, message)}


def _unrun_result(source: ResultSource, line_no: int) -> dict[str, Any]:
    if source.unrun != ResultType.ERRORED:
        return {"type": source.unrun}
    message = source.line_errors.get(line_no, source.failure)
    return {"type": ResultType.ERRORED, "error": anthropic_error(400, message)}


def _custom_id(raw: bytes) -> str | None:
    try:
        custom_id = orjson.loads(raw).get("custom_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return custom_id if isinstance(custom_id, str) else None


def _jsonl(custom_id: str, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "result": result}) + b"\n"
