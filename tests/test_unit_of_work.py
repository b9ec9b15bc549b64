"""A request's transaction that records stored bytes: they go only if it did not commit.

A request is cancelled (its client gone, the server stopping) while its transaction runs;
the transaction still ends, and if it committed, the File it registered is visible, so its
bytes must stay. Driven the way `POST /v1/files` does it: the real intake, storage and
registration, in a `UnitOfWork` on the real database.
"""

import asyncio
import threading
from collections.abc import Callable
from functools import partial

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.db.models import File
from app.db.session import session_factory, session_scope, upgrade
from app.services import file_intake
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.file_intake import ReceivedFile
from app.storage import Storage, storage_for


def _received(settings: Settings, storage: Storage) -> ReceivedFile:
    """A file's bytes committed to storage, not yet registered (`file_intake.receive`)."""
    intake = file_intake.FileIntake(settings, storage)
    intake.open("notes.txt", "user_data").write(b"kept only if registered\n")
    return file_intake.receive(settings, intake, {"purpose": "user_data"})


def _project(settings: Settings) -> str:
    with session_scope(settings) as session:
        return ensure_project(session, DEFAULT_PROJECT).id


def _registered(settings: Settings, file_id: str) -> bool:
    with session_scope(settings) as session:
        return session.scalar(select(File.id).where(File.id == file_id)) is not None


async def _register_cancelled(
    settings: Settings, storage: Storage, received: ReceivedFile, register: Callable[..., object]
) -> None:
    """Registers `received` as the route does, cancelling the request mid-transaction."""
    started, go_on = threading.Event(), threading.Event()

    def slow(session: Session, *args: object) -> object:
        started.set()
        go_on.wait(30)
        return register(session, *args)

    with session_factory(settings.sqlalchemy_url)(autobegin=False) as session:
        request = asyncio.create_task(
            UnitOfWork(session).run_or_undo(
                partial(storage.delete, received.stored.key),
                slow,
                settings,
                _project(settings),
                received,
            )
        )
        await asyncio.to_thread(started.wait, 30)
        request.cancel()  # the client goes away while the transaction runs
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await request


def _refused(session: Session, *args: object) -> object:
    file_intake.register_received(session, *args)  # type: ignore[arg-type]
    raise RuntimeError("the registration is refused after its row was added")


def test_a_request_cancelled_after_its_commit_keeps_the_files_bytes(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    storage = storage_for(str(settings.storage_dir))
    received = _received(settings, storage)
    asyncio.run(_register_cancelled(settings, storage, received, file_intake.register_received))
    assert _registered(settings, received.file_id), "the transaction committed"
    assert storage.exists(received.stored.key), "a visible File keeps its bytes"


def test_a_registration_that_did_not_commit_removes_the_bytes(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    storage = storage_for(str(settings.storage_dir))
    cancelled, failed = _received(settings, storage), _received(settings, storage)
    asyncio.run(_register_cancelled(settings, storage, cancelled, _refused))

    async def refused_outright() -> None:
        with session_factory(settings.sqlalchemy_url)(autobegin=False) as session:
            await UnitOfWork(session).run_or_undo(
                partial(storage.delete, failed.stored.key),
                _refused,
                settings,
                _project(settings),
                failed,
            )

    with pytest.raises(RuntimeError):
        asyncio.run(refused_outright())
    for received in (cancelled, failed):
        assert not _registered(settings, received.file_id)
        assert not storage.exists(received.stored.key), "no row names these bytes"
