"""A batch's results so far, a page at a time, behind a cursor (`app.core.result_cursor`).

While the batch runs, a page is read from its committed result chunks: the rows say which
objects are whole and recorded, so an object whose row has not committed is never read. Each
line is the output or error file line it will be. Once the batch has ended its chunks are
gone and a page is read from its output and error files, marked complete. A cursor taken while
the batch ran cannot be placed in the files (they are in input order, the chunks in the order
lines finished): its next page restarts from the files' start, marked `restarted`.

Nothing here writes or locks: on SQLite the reads take no write lock, on PostgreSQL they see a
snapshot, so workers record chunks as fast with readers as without.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.chunks import decode_chunk
from app.core.result_cursor import (
    BadCursor,
    ChunkCursor,
    ChunkPosition,
    Cursor,
    FileCursor,
    ResultFile,
    decode,
    encode,
)
from app.core.states import TERMINAL_BATCH_STATUSES, BatchApi
from app.db.models import Batch, File, ResultChunk, Shard
from app.errors import OpenAIError, not_found
from app.services.jsonl import scan_lines
from app.services.message_batch_results import result_of
from app.services.pagination import check_limit
from app.storage import Storage

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_ROWS_PER_FETCH = 500


@dataclass(frozen=True)
class ChunkToRead:
    shard_index: int
    epoch: int
    sequence: int
    key: str
    skip: int  # lines of it read already


@dataclass
class Source:
    """Where the next page is: chunks of a running batch, or an ended batch's files."""

    cursor: Cursor
    ended: bool
    chunks: list[ChunkToRead] = field(default_factory=list)
    files: dict[ResultFile, str] = field(default_factory=dict)  # storage keys
    restarted: bool = False


@dataclass(frozen=True)
class ResultsPage:
    lines: list[dict[str, Any]]
    cursor: str
    has_more: bool
    complete: bool
    restarted: bool
    missing_chunk: bool = False  # one went while it was read: the batch may have just ended


def locate(
    session: Session,
    scope: str | None,
    batch_id: str,
    api: BatchApi | None,
    after: str | None,
    limit: int,
) -> Source:
    """The batch's next page's source; `scope` is the caller's project (None: an admin), `api`
    the wire format the batch must have been created through (None: any)."""
    check_limit(limit, MAX_LIMIT)
    batch = _find(session, scope, batch_id, api)
    cursor = _decode(after)
    if batch.status in TERMINAL_BATCH_STATUSES:
        return _file_source(session, batch, cursor)
    if isinstance(cursor, FileCursor):
        raise OpenAIError("Invalid 'after': this batch has not ended.", param="after")
    return Source(cursor, ended=False, chunks=_chunks_after(session, batch_id, cursor, limit))


def has_ended(session: Session, scope: str | None, batch_id: str, api: BatchApi | None) -> bool:
    return _find(session, scope, batch_id, api).status in TERMINAL_BATCH_STATUSES


def read(storage: Storage, source: Source, limit: int) -> ResultsPage:
    """Up to `limit` result lines from `source`, and the cursor after them."""
    if source.ended:
        return _read_files(storage, source, limit)
    return _read_chunks(storage, source, limit)


def _find(session: Session, scope: str | None, batch_id: str, api: BatchApi | None) -> Batch:
    query = select(Batch).where(Batch.id == batch_id)
    if scope is not None:
        query = query.where(Batch.project_id == scope)
    if api is not None:
        query = query.where(Batch.api == api)
    batch = session.scalar(query)
    if batch is None:
        raise not_found("Batch", batch_id)
    return batch


def _decode(after: str | None) -> Cursor:
    try:
        return decode(after)
    except BadCursor:
        raise OpenAIError(
            "Invalid 'after': not a cursor this route returned.", param="after"
        ) from None


def _file_source(session: Session, batch: Batch, cursor: Cursor) -> Source:
    ids = {ResultFile.OUTPUT: batch.output_file_id, ResultFile.ERROR: batch.error_file_id}
    found = session.execute(select(File.id, File.storage_key).where(File.id.in_(ids.values())))
    keys = {file_id: key for file_id, key in found}
    files = {side: keys[i] for side, i in ids.items() if i is not None and keys.get(i)}
    if isinstance(cursor, ChunkCursor):
        return Source(FileCursor(), ended=True, files=files, restarted=bool(cursor.shards))
    return Source(cursor, ended=True, files=files)


def _chunks_after(
    session: Session, batch_id: str, cursor: ChunkCursor, limit: int
) -> list[ChunkToRead]:
    """The committed chunks past the cursor, in (shard, epoch, sequence) order, until they
    hold one line more than a page (so that `has_more` is known)."""
    rows = session.execute(
        select(
            Shard.index,
            ResultChunk.epoch,
            ResultChunk.sequence,
            ResultChunk.storage_key,
            ResultChunk.lines,
        )
        .join(Shard, Shard.id == ResultChunk.shard_id)
        .where(Shard.batch_id == batch_id)
        .order_by(Shard.index, ResultChunk.epoch, ResultChunk.sequence)
        .execution_options(yield_per=_ROWS_PER_FETCH)
    )
    chunks: list[ChunkToRead] = []
    wanted = limit + 1
    for index, epoch, sequence, key, lines in rows:
        skip = _read_already(cursor.shards.get(index), epoch, sequence)
        if skip is None or skip >= lines:
            continue
        chunks.append(ChunkToRead(index, epoch, sequence, key, skip))
        wanted -= lines - skip
        if wanted <= 0:
            break
    rows.close()
    return chunks


def _read_already(at: ChunkPosition | None, epoch: int, sequence: int) -> int | None:
    """How many lines of chunk `(epoch, sequence)` were read; None: all of it (an earlier one)."""
    if at is None or (epoch, sequence) > (at.epoch, at.sequence):
        return 0
    return at.taken if (epoch, sequence) == (at.epoch, at.sequence) else None


def _read_chunks(storage: Storage, source: Source, limit: int) -> ResultsPage:
    assert isinstance(source.cursor, ChunkCursor)
    shards = dict(source.cursor.shards)
    lines: list[dict[str, Any]] = []
    has_more = missing = False
    for chunk in source.chunks:
        try:
            outputs = _chunk_outputs(storage, chunk.key)
        except FileNotFoundError:
            missing = True  # its row goes too, and its lines are recorded again
            continue
        taken = chunk.skip
        for output in outputs[chunk.skip :]:
            if len(lines) == limit:
                has_more = True
                break
            lines.append(output)
            taken += 1
        shards[chunk.shard_index] = ChunkPosition(chunk.epoch, chunk.sequence, taken)
        if has_more:
            break
    cursor = encode(ChunkCursor(shards))
    return ResultsPage(lines, cursor, has_more, False, False, missing_chunk=missing)


def _chunk_outputs(storage: Storage, key: str) -> list[dict[str, Any]]:
    return [output for _line, output in decode_chunk(b"".join(storage.read(key)))]


def _read_files(storage: Storage, source: Source, limit: int) -> ResultsPage:
    assert isinstance(source.cursor, FileCursor)
    at = source.cursor
    lines: list[dict[str, Any]] = []
    for side, raw, end in _file_lines(storage, source.files, at):
        if len(lines) == limit:
            return ResultsPage(lines, encode(at), True, True, source.restarted)
        lines.append(orjson.loads(raw))
        at = FileCursor(side, end)
    return ResultsPage(lines, encode(at), False, True, source.restarted)


def _file_lines(
    storage: Storage, files: dict[ResultFile, str], start: FileCursor
) -> Iterator[tuple[ResultFile, bytes, int]]:
    """`(file, line, offset after it)` of each result line from `start` on."""
    for side in ResultFile:
        key = files.get(side)
        if side < start.file or key is None:
            continue
        begin = start.offset if side == start.file else 0
        for _no, offset, raw in scan_lines(storage.read(key, begin), begin):
            yield side, raw, offset + len(raw) + 1


def as_message_results(page: ResultsPage) -> bytes:
    """The page as a Message Batch's results JSONL (`message_batch_results`'s shape)."""
    return b"".join(
        orjson.dumps({"custom_id": line["custom_id"], "result": result_of(line)}) + b"\n"
        for line in page.lines
    )
