"""Output delivery: the finished files into the `-o` (and `--error-file`) path or URL."""

from collections.abc import Iterable, Iterator

import httpx
import orjson
from sqlalchemy import select

from app.config import Settings
from app.db.models import File
from app.db.session import session_scope
from app.offline.arguments import OPENAI_FORMAT
from app.offline.errors import OfflineError
from app.offline.lines import in_input_order, vllm_error_line
from app.offline.source import INPUT_FILE_ID, is_url
from app.schemas.batches import BatchObject
from app.services.jsonl import iter_lines
from app.storage import storage_of
from app.storage.base import READ_CHUNK


def deliver(chunks: Iterable[bytes], target: str) -> None:
    """One PUT for a URL; else written into the path itself (truncated, never replaced), so a
    FIFO, /dev/stdout, a bind mount or a handle opened before all see it. A run that dies
    mid-write leaves the results in the work directory: rerunning writes them again."""
    if is_url(target):
        try:
            response = httpx.put(target, content=chunks, timeout=300)
        except httpx.HTTPError as exc:
            raise OfflineError(f"cannot PUT {target}: {exc}") from None
        if response.status_code >= 400:
            raise OfflineError(f"PUT {target} answered {response.status_code}")
        return
    with open(target, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def write_results(
    settings: Settings,
    batch: BatchObject,
    output: str,
    errors: str | None,
    output_format: str,
) -> None:
    successes = _lines(settings, batch.output_file_id)
    failures = _lines(settings, batch.error_file_id)
    if output_format != OPENAI_FORMAT:
        failures = (orjson.dumps(vllm_error_line(orjson.loads(raw))) for raw in failures)
    if errors is None:
        # One file with every line in the input's order, as vLLM's run_batch writes it.
        merged = in_input_order(_input_custom_ids(settings), successes, failures)
        deliver(_joined(merged), output)
        return
    deliver(_joined(successes), output)
    deliver(_joined(failures), errors)


def _lines(settings: Settings, file_id: str | None) -> Iterator[bytes]:
    if file_id is None:
        return
    with session_scope(settings) as session:
        key = session.scalars(select(File.storage_key).where(File.id == file_id)).one()
    for _line_no, raw in iter_lines(storage_of(settings), key):
        yield raw


def _input_custom_ids(settings: Settings) -> Iterator[str]:
    for raw in _lines(settings, INPUT_FILE_ID):
        yield str(orjson.loads(raw)["custom_id"])


def _joined(lines: Iterable[bytes]) -> Iterator[bytes]:
    """Newline-terminated lines in writes of about READ_CHUNK bytes."""
    pending: list[bytes] = []
    size = 0
    for line in lines:
        pending.append(line)
        size += len(line) + 1
        if size >= READ_CHUNK:
            yield b"\n".join(pending) + b"\n"
            pending, size = [], 0
    if pending:
        yield b"\n".join(pending) + b"\n"
