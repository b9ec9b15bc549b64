"""A request's unit of work: the one way a route reaches the database.

Routes never hold a `Session`. They call `await uow.run(service_fn, …)`: the service runs on
a worker thread inside one transaction, committed when it returns and rolled back if it
raises. Services take that `Session` and never begin, commit or roll back themselves. Work on
bytes (streaming an upload, joining parts) runs between two `run`s, with no transaction open.

The session is opened with `autobegin=False`, so a query outside `run` fails at once instead
of holding a transaction (and, on SQLite, the write lock) by accident.
"""

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

P = ParamSpec("P")
T = TypeVar("T")


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

        def transaction() -> T:
            with self._session.begin():
                return fn(self._session, *args, **kwargs)

        return await run_in_threadpool(transaction)
