"""A request's unit of work: the one way a route reaches the database.

Routes never hold a `Session`. They call `await uow.run(service_fn, …)`: the service runs on
a worker thread inside one transaction, committed when it returns and rolled back if it
raises. Services take that `Session` and never begin, commit or roll back themselves. Work on
bytes (streaming an upload, joining parts) runs between two `run`s, with no transaction open;
the `run` that records bytes is `run_or_undo`, which removes them unless it committed.

The session is opened with `autobegin=False`, so a query outside `run` fails at once instead
of holding a transaction (and, on SQLite, the write lock) by accident.
"""

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy.orm import Session

from app.db.session import TRANSACTION_THREADS

P = ParamSpec("P")
T = TypeVar("T")

# Transactions run on threads of their own, not on the pool that streams bytes (uploads,
# downloads), so that a big upload never queues a retrieve behind its writes. A few threads
# do: a transaction is short, and every extra runnable thread costs CPU in GIL hand-offs
# (at 200 concurrent requests, anyio's 40 cost more than the requests' own work). Each
# engine's pool keeps a connection for every one of them (`POOL_SIZE`).
_THREADS = ThreadPoolExecutor(TRANSACTION_THREADS, thread_name_prefix="overnight-transaction")


class UnitOfWork:
    def __init__(self, session: Session) -> None:
        self._session = session

    async def run(
        self, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`fn(session, …)` in one transaction, off the event loop; keep it short.

        On SQLite a writing request's transaction holds the write lock from its start
        (`BEGIN IMMEDIATE`); a `GET` or `HEAD` reads in a deferred one that takes no lock.
        """
        return await _outcome(self._start(fn, *args, **kwargs))

    async def run_or_undo(
        self,
        undo: Callable[[], object],
        fn: Callable[Concatenate[Session, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`run`, then `undo()` unless the transaction committed, however the request ends.

        For bytes written before the transaction that records them: bytes no row names go,
        but a request cancelled (its client gone) after the commit keeps them, for the row
        that names them is visible.
        """
        done = self._start(fn, *args, **kwargs)
        try:
            return await _outcome(done)
        except BaseException:
            if _rolled_back(done):
                undo()
            raise

    def _start(
        self, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> "asyncio.Future[T]":
        def transaction() -> T:
            with self._session.begin():
                return fn(self._session, *args, **kwargs)

        # The caller's context (its request id) goes along to the thread.
        context = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(_THREADS, context.run, transaction)


async def _outcome(done: "asyncio.Future[T]") -> T:
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # The transaction cannot be stopped halfway: its session stays the thread's until it
        # ends, and the caller (which closes the session) is cancelled then.
        await _ended(done)
        raise


def _rolled_back(done: "asyncio.Future[Any]") -> bool:
    """Whether the transaction ended without committing (never run, or raised); one still
    running may yet commit."""
    return done.done() and (done.cancelled() or done.exception() is not None)


async def _ended(future: "asyncio.Future[Any]") -> None:
    """Waits until `future` is done, whatever cancels the waiting meanwhile."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue
