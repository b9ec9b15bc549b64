"""Dependencies the routes declare by type: settings, a database session, storage, caller."""

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.session import read_session_factory, session_factory
from app.errors import OpenAIError
from app.services.auth import Access, Principal, authenticate
from app.storage import Storage, storage_of


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(request: Request, settings: SettingsDep) -> Iterator[Session]:
    reads_only = request.method in ("GET", "HEAD")
    factory = read_session_factory if reads_only else session_factory
    with factory(settings.sqlalchemy_url)() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def get_storage(settings: SettingsDep) -> Storage:
    return storage_of(settings)


StorageDep = Annotated[Storage, Depends(get_storage)]


def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


AccessDep = Annotated[Access, Depends(get_access)]


def get_principal(
    session: SessionDep,
    settings: SettingsDep,
    access: AccessDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    principal = authenticate(session, settings, access, authorization)
    session.commit()  # release SQLite's write lock before the route's own work
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise OpenAIError("This operation needs an admin key.", status_code=403)
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
