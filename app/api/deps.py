"""Dependencies the routes declare by type: settings, the unit of work, storage, caller.

Every dependency is `async def`: FastAPI runs a plain `def` one on a worker thread, and a
thread hop costs more than these functions do.
"""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.db.session import read_session_factory, session_factory
from app.errors import OpenAIError
from app.services.auth import Access, Principal, bearer_token, key_principal, keyless_principal
from app.services.principal_cache import PrincipalCache
from app.services.stats import Stats, StatsReader
from app.storage import Storage, storage_of


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def _sessions(request: Request, settings: Settings) -> sessionmaker[Session]:
    reads_only = request.method in ("GET", "HEAD")
    factory = read_session_factory if reads_only else session_factory
    return factory(settings.sqlalchemy_url)


async def get_unit_of_work(request: Request) -> AsyncIterator[UnitOfWork]:
    # No connection is taken before `run`: opening and closing the session here is cheap.
    # The settings are read here, not through `SettingsDep`: a dependency costs more.
    with _sessions(request, request.app.state.settings)(autobegin=False) as session:
        yield UnitOfWork(session)


UnitOfWorkDep = Annotated[UnitOfWork, Depends(get_unit_of_work)]


async def get_storage(settings: SettingsDep) -> Storage:
    return storage_of(settings)


StorageDep = Annotated[Storage, Depends(get_storage)]


async def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


AccessDep = Annotated[Access, Depends(get_access)]


async def get_principal_cache(request: Request) -> PrincipalCache:
    cache: PrincipalCache = request.app.state.principals
    return cache


PrincipalCacheDep = Annotated[PrincipalCache, Depends(get_principal_cache)]


async def get_stats(request: Request) -> Stats:
    """The deployment's figures (`app.services.stats`), read off the event loop."""
    reader: StatsReader = request.app.state.stats
    return await run_in_threadpool(reader.get)


StatsDep = Annotated[Stats, Depends(get_stats)]


async def get_principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """The caller; a key seen in the last `auth_cache_seconds` costs no database read.

    Reads the app's state itself rather than through other dependencies: this runs on
    every request, and each dependency FastAPI solves costs more than the lookup.
    """
    state = request.app.state
    token = bearer_token(authorization)
    if token is not None:
        principal = state.principals.get(token)
        if principal is not None:
            return principal
    # Its own transactions: SQLite's write lock is not held into the route's work.
    settings: Settings = state.settings
    with _sessions(request, settings)(autobegin=False) as session:
        uow = UnitOfWork(session)
        if token is not None:
            principal = await uow.run(key_principal, settings, token)
            if principal is not None:
                state.principals.put(token, principal)
                return principal
        return await uow.run(keyless_principal, settings, state.access, token)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise OpenAIError("This operation needs an admin key.", status_code=403)
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
