"""Result lines of one leased shard, sealed into immutable chunk objects (`app.core.chunks`).

The lines wait in memory only until the next checkpoint (≤ 1 s).
"""

from dataclasses import dataclass, field
from typing import Any

from app.core.chunks import encode_chunk, encode_line
from app.core.leases import ShardLease
from app.core.progress import Progress
from app.ids import new_batch_request_id
from app.storage import Storage
from app.storage.base import put
from worker.engine_results import EngineResult
from worker.scheduler import Job


@dataclass
class Chunk:
    sequence: int
    key: str
    data: bytes
    lines: int
    progress: Progress
    written: bool = False


def output_line(job: Job, result: EngineResult, copied: bool) -> dict[str, Any]:
    """The output/error file line for a job, with its own `batch_req_…` and `req_…` ids."""
    body = result.body_json()
    if copied:
        parsed = result.parsed_body()
        if isinstance(parsed.get("id"), str) and "-" in parsed["id"]:
            # A copied answer gets an id of its own, in the engine's format.
            body = {**parsed, "id": f"{parsed['id'].split('-', 1)[0]}-{job.engine_id}"}
    return {
        "id": new_batch_request_id(),
        "custom_id": job.custom_id,
        "response": {
            "status_code": result.status_code,
            "request_id": job.request_id,
            "body": body,
        },
        "error": None,
    }


@dataclass
class ResultWriter:
    storage: Storage
    lease: ShardLease
    _lines: list[bytes] = field(default_factory=list)
    _progress: Progress = field(default_factory=Progress)
    _sequence: int = 0

    @property
    def buffered(self) -> int:
        return len(self._lines)

    def add(self, job: Job, result: EngineResult, copied: bool) -> None:
        self._lines.append(encode_line(job.line, output_line(job, result, copied)))
        self._progress.add(result.ok, result.usage)

    def seal(self) -> Chunk | None:
        """Take the buffered lines as the next chunk, or None if there are none."""
        if not self._lines:
            return None
        chunk = Chunk(
            sequence=self._sequence,
            key=self.lease.chunk_key(self._sequence),
            data=encode_chunk(self._lines),
            lines=len(self._lines),
            progress=self._progress,
        )
        self._sequence += 1
        self._lines, self._progress = [], Progress()
        return chunk

    def write(self, chunk: Chunk) -> None:
        """Store the chunk object (atomically); blocking, run it in a thread."""
        if not chunk.written:
            put(self.storage, chunk.key, [chunk.data])
            chunk.written = True
