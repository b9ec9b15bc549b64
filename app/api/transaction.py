"""Run a service call in one short database transaction, off the event loop."""

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

P = ParamSpec("P")
T = TypeVar("T")


async def in_transaction(
    session: Session,
    fn: Callable[Concatenate[Session, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """`fn(session, …)` on a worker thread inside `session.begin()`: committed on success.

    On SQLite every transaction holds the write lock, so keep `fn` short.
    """

    def run() -> T:
        with session.begin():
            return fn(session, *args, **kwargs)

    return await run_in_threadpool(run)
