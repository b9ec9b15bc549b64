"""Deterministic faults at the named points of every write path, injected from outside.

A point is an event (an object's put or delete, a commit) at a site: a function on the call
stack, and for the API's transactions (committed by the unit of work, whose caller is gone
from the stack by then) a table the transaction writes. Armed, the point fires once, at its
`nth` match: the process stops (`os._exit`) or the call raises. A raise after a commit is the
lost reply: the commit went through, the caller sees the connection drop.

Nothing in production knows: storage is wrapped (`FaultingStorage`), commits are seen through
SQLAlchemy's session and connection events (`Injector.install`).
"""

import errno
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, SessionTransaction

from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, ResultChunk, Shard
from app.storage import Storage, StoredObject, Writer
from app.storage.base import ListedObject

FAULT_EXIT = 86  # the exit status of a process stopped at a point
_TRANSACTION = "app.api.unit_of_work.UnitOfWork._start.<locals>.transaction"
_WRITE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)', re.IGNORECASE)


class Event(StrEnum):
    PUT_BEFORE = "put.before"
    PUT_AFTER = "put.after"
    DELETE_BEFORE = "delete.before"
    DELETE_AFTER = "delete.after"
    COMMIT_BEFORE = "commit.before"
    COMMIT_AFTER = "commit.after"


class Action(StrEnum):
    EXIT = "exit"
    RAISE = "raise"


class Path(StrEnum):
    """The write path a point is on: the scenario that reaches it."""

    BATCH = "batch"  # validation, shards, checkpoints, finalization
    FILE = "file"  # POST /v1/files
    UPLOAD = "upload"  # POST /v1/uploads, its parts and complete


@dataclass(frozen=True)
class Site:
    name: str
    path: Path
    where: str  # `module.qualname` of a function on the stack
    writes: str | None = None  # a table the transaction writes
    nth: int = 1


@dataclass(frozen=True)
class FaultPoint:
    site: Site
    event: Event

    @property
    def name(self) -> str:
        return f"{self.site.name}:{self.event}"


_COMMIT = (Event.COMMIT_BEFORE, Event.COMMIT_AFTER)
_PUT = (Event.PUT_BEFORE, Event.PUT_AFTER)
_DELETE = (Event.DELETE_BEFORE, Event.DELETE_AFTER)

_SITES: list[tuple[Site, tuple[Event, Event]]] = [
    (Site("validation.claim", Path.BATCH, "app.services.steps.validation.claim_next"), _COMMIT),
    (Site("validation.record", Path.BATCH, "app.services.steps.validation.record"), _COMMIT),
    (Site("shard.claim", Path.BATCH, "worker.loop.Worker._take_shard"), _COMMIT),
    (Site("checkpoint.chunk", Path.BATCH, "worker.writer.ResultWriter.write"), _PUT),
    (Site("checkpoint.record", Path.BATCH, "worker.shard.ShardRun._record"), _COMMIT),
    (Site("finalizer.claim", Path.BATCH, "app.services.steps.finalization_claim.claim"), _COMMIT),
    (
        Site(
            "finalizer.merge.output", Path.BATCH, "app.services.steps.output_files._LazyFile.commit"
        ),
        _PUT,
    ),
    (
        Site(
            "finalizer.merge.error",
            Path.BATCH,
            "app.services.steps.output_files._LazyFile.commit",
            nth=2,
        ),
        _PUT,
    ),
    (Site("finalizer.record", Path.BATCH, "app.services.steps.finalization._record"), _COMMIT),
    (
        Site("finalizer.chunks", Path.BATCH, "app.services.steps.chunk_cleanup._delete_chunks"),
        _DELETE,
    ),
    (
        Site("finalizer.chunk_rows", Path.BATCH, "app.services.steps.chunk_cleanup._delete_chunks"),
        _COMMIT,
    ),
    (Site("files.bytes", Path.FILE, "app.services.file_intake.receive"), _PUT),
    (Site("files.register", Path.FILE, _TRANSACTION, writes="files"), _COMMIT),
    (Site("uploads.part", Path.UPLOAD, "app.services.uploads.store_part"), _PUT),
    (Site("uploads.part_record", Path.UPLOAD, _TRANSACTION, writes="upload_parts"), _COMMIT),
    (Site("uploads.join", Path.UPLOAD, "app.services.uploads.join_parts"), _PUT),
    (Site("uploads.complete", Path.UPLOAD, _TRANSACTION, writes="files"), _COMMIT),
    (Site("uploads.parts_cleanup", Path.UPLOAD, "app.services.uploads.delete_parts"), _DELETE),
]

POINTS = [FaultPoint(site, e) for site, events in _SITES for e in events]
POINTS_BY_NAME = {point.name: point for point in POINTS}


class InjectedFault(OSError):
    """A store's call that failed (as a disk or an S3 request can)."""


def _stack_sites() -> set[str]:
    frame = sys._getframe(2)
    names = set()
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("app.", "worker.")):
            names.add(f"{module}.{frame.f_code.co_qualname}")
        frame = frame.f_back  # type: ignore[assignment]
    return names


class Injector:
    """Fires `point` once, at its `nth` match, with `action`."""

    def __init__(self, point: FaultPoint, action: Action) -> None:
        self.point = point
        self.action = action
        self.matches = 0
        self.fired = False
        self._lock = threading.Lock()
        self._hooks: list[tuple[Any, str, Callable[..., None]]] = []

    def reach(self, moment: Event, tables: frozenset[str] = frozenset()) -> None:
        """Called at every event of the process; fires if this is the armed point."""
        site = self.point.site
        if self.fired or moment is not self.point.event:
            return
        if site.writes is not None and site.writes not in tables:
            return
        if site.where not in _stack_sites():
            return
        with self._lock:
            self.matches += 1
            if self.fired or self.matches != site.nth:
                return
            self.fired = True
        self.fire(moment)

    def fire(self, moment: Event) -> None:
        if self.action is Action.EXIT:
            os._exit(FAULT_EXIT)
        if moment in _COMMIT:
            reset = ConnectionResetError("connection reset by peer (injected)")
            raise OperationalError("COMMIT", None, reset)
        raise InjectedFault(errno.EIO, f"injected at {self.point.name}")

    # -- commits, seen through SQLAlchemy's events --
    def install(self, engine: Engine) -> "Injector":
        self._hooks = [
            (engine, "before_cursor_execute", _note_write),
            (engine, "commit", _forget_writes),
            (engine, "rollback", _forget_writes),
            (Session, "after_begin", _note_connection),
            (Session, "before_commit", self._before_commit),
            (Session, "after_commit", self._after_commit),
        ]
        for target, name, hook in self._hooks:
            event.listen(target, name, hook)
        return self

    def remove(self) -> None:
        for target, name, hook in self._hooks:
            event.remove(target, name, hook)
        self._hooks = []

    def _before_commit(self, session: Session) -> None:
        tables = _written(session)
        session.info["fault_tables"] = tables
        self.reach(Event.COMMIT_BEFORE, tables)

    def _after_commit(self, session: Session) -> None:
        tables = session.info.pop("fault_tables", frozenset())
        session.info.pop("fault_connections", None)
        self.reach(Event.COMMIT_AFTER, tables)


def _note_write(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
    if match := _WRITE.match(statement):
        conn.info.setdefault("fault_writes", set()).add(match.group(1).lower())


def _forget_writes(conn: Any) -> None:
    conn.info.pop("fault_writes", None)


def _note_connection(session: Session, _transaction: SessionTransaction, conn: Any) -> None:
    session.info.setdefault("fault_connections", []).append(conn)


def _written(session: Session) -> frozenset[str]:
    """The tables the session's transaction wrote, or will at its last flush."""
    tables: set[str] = set()
    for conn in session.info.get("fault_connections", []):
        tables |= conn.info.get("fault_writes", set())
    for obj in [*session.new, *session.dirty, *session.deleted]:
        tables.add(obj.__tablename__)
    return frozenset(tables)


# -- objects, through a wrapped store --
class FaultingWriter:
    def __init__(self, inner: Writer, injector: Injector | None) -> None:
        self._inner = inner
        self._injector = injector
        self.key = inner.key

    @property
    def bytes_written(self) -> int:
        return self._inner.bytes_written

    def write(self, data: bytes) -> None:
        self._inner.write(data)

    def commit(self) -> StoredObject:
        if self._injector is not None:
            try:
                self._injector.reach(Event.PUT_BEFORE)
            except BaseException:
                self._inner.abort()  # as a store whose commit failed: nothing half-written
                raise
        stored = self._inner.commit()
        if self._injector is not None:
            self._injector.reach(Event.PUT_AFTER)
        return stored

    def abort(self) -> None:
        self._inner.abort()


class FaultingStorage:
    """The deployment's store, with the injector's object events, and a watch on deletes:
    deleting a chunk that a row records while its batch is open is what item 1 of issue 27
    did (the batch then cannot end); each such key is appended to `violations`."""

    def __init__(
        self,
        inner: Storage,
        injector: Injector | None,
        recorded_chunk: Callable[[str], bool],
        violations: str,
    ) -> None:
        self._inner = inner
        self._injector = injector
        self._recorded_chunk = recorded_chunk
        self._violations = violations

    def writer(self, key: str) -> FaultingWriter:
        return FaultingWriter(self._inner.writer(key), self._injector)

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        return self._inner.read(key, start, end)

    def size(self, key: str) -> int:
        return self._inner.size(key)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self._inner.list(prefix)

    def scan(self, folder: str, start_after: str = "") -> Iterator[ListedObject]:
        return self._inner.scan(folder, start_after)

    def delete(self, key: str) -> None:
        if self._recorded_chunk(key):
            with open(self._violations, "a") as log:
                log.write(f"recorded chunk of an open batch deleted: {key}\n")
        if self._injector is not None:
            self._injector.reach(Event.DELETE_BEFORE)
        self._inner.delete(key)
        if self._injector is not None:
            self._injector.reach(Event.DELETE_AFTER)

    def sweep_temp(self, older_than_seconds: float) -> int:
        return self._inner.sweep_temp(older_than_seconds)


def recorded_chunk_check(read_session: Callable[[], Session]) -> Callable[[str], bool]:
    """Whether a row records chunk `key` and its batch is not over (read-only: on SQLite it
    takes no lock, so it may run inside another transaction's thread)."""
    open_batch = select(ResultChunk.id).join(Shard, Shard.id == ResultChunk.shard_id)
    open_batch = open_batch.join(Batch, Batch.id == Shard.batch_id)
    open_batch = open_batch.where(Batch.status.not_in(TERMINAL_BATCH_STATUSES))

    def recorded(key: str) -> bool:
        if not key.startswith("batches/"):
            return False
        with read_session() as session:
            return session.scalar(open_batch.where(ResultChunk.storage_key == key)) is not None

    return recorded
