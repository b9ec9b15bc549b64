"""Finding the batches whose input has a given `custom_id`: a streamed scan with a byte cap.

No index of custom_ids is kept: recording every line's id at validation would write a row
per request for every batch, to serve a search an operator makes now and then. Instead the
input files of the batches that pass the other filters are read newest first, one line at a
time, and the scan stops at a byte budget; the caller gets a cursor to search on from there.
Only batches that ran are scanned: their input passed validation, so every line is bounded.
"""

from dataclasses import dataclass

import orjson
from sqlalchemy.orm import Session

from app.services.jsonl import scan_lines
from app.services.monitoring import BatchFilter, BatchView, batch_views, batches_to_scan
from app.storage import Storage

SCAN_BYTES = 256 * 1000 * 1000
CANDIDATES = 200
# Characters a JSON writer may escape: an id with none can be found in the raw bytes first.
_ESCAPABLE = frozenset('"\\/')


@dataclass
class CustomIdMatches:
    views: list[BatchView]
    scanned_bytes: int
    next_after: str | None  # where to go on: the last batch scanned, when the scan stopped early


def find_custom_id(
    session: Session,
    storage: Storage,
    where: BatchFilter,
    custom_id: str,
    *,
    limit: int = 100,
    budget: int = SCAN_BYTES,
) -> CustomIdMatches:
    """Up to `limit` batches, newest first, with a request of this `custom_id`."""
    found: list[str] = []
    scanned = 0
    candidates = batches_to_scan(session, where, CANDIDATES)
    for i, (batch_id, input_file) in enumerate(candidates):
        if scanned and scanned + input_file.bytes > budget:
            return _matches(session, found, scanned, candidates[i - 1][0])
        scanned += input_file.bytes
        if _has_custom_id(storage, input_file.storage_key, custom_id):
            found.append(batch_id)
            if len(found) == limit:
                return _matches(session, found, scanned, batch_id)
    more = len(candidates) == CANDIDATES
    return _matches(session, found, scanned, candidates[-1][0] if more else None)


def _matches(
    session: Session, found: list[str], scanned: int, next_after: str | None
) -> CustomIdMatches:
    return CustomIdMatches(batch_views(session, found), scanned, next_after)


def _has_custom_id(storage: Storage, key: str, custom_id: str) -> bool:
    raw = custom_id.encode()
    prefilter = custom_id.isascii() and custom_id.isprintable() and not _ESCAPABLE & set(custom_id)
    for _line_no, _offset, line in scan_lines(storage.read(key)):
        if prefilter and raw not in line:
            continue
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(request, dict) and request.get("custom_id") == custom_id:
            return True
    return False
