"""Dependencies the routes declare by type: settings, the unit of work, storage, caller."""

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request

from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.db.session import read_session_factory, session_factory
from app.errors import OpenAIError
from app.services.auth import Access, Principal, authenticate
from app.storage import Storage, storage_of


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_unit_of_work(request: Request, settings: SettingsDep) -> Iterator[UnitOfWork]:
    reads_only = request.method in ("GET", "HEAD")
    factory = read_session_factory if reads_only else session_factory
    with factory(settings.sqlalchemy_url)(autobegin=False) as session:
        yield UnitOfWork(session)


UnitOfWorkDep = Annotated[UnitOfWork, Depends(get_unit_of_work)]


def get_storage(settings: SettingsDep) -> Storage:
    return storage_of(settings)


StorageDep = Annotated[Storage, Depends(get_storage)]


def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


AccessDep = Annotated[Access, Depends(get_access)]


async def get_principal(
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    access: AccessDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    # Its own transaction: SQLite's write lock is not held into the route's work.
    return await uow.run(authenticate, settings, access, authorization)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise OpenAIError("This operation needs an admin key.", status_code=403)
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
