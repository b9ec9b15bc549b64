"""Projects and API keys: who is calling, and which project's objects they see."""

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import ApiKey, Project
from app.errors import OpenAIError, not_found
from app.ids import new_id

DEFAULT_PROJECT = "default"
KEY_PREFIX = "sk-ovn-"


@dataclass(frozen=True)
class Principal:
    project_id: str
    role: str  # "admin" or "member"

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def ensure_project(session: Session, name: str) -> Project:
    query = select(Project).where(Project.name == name)
    project = session.scalar(query)
    if project is not None:
        return project
    try:
        # Two first requests may race to create the project (PostgreSQL): one wins.
        with session.begin_nested():
            project = Project(id=new_id("proj_"), name=name, created_at=int(time.time()))
            session.add(project)
        return project
    except IntegrityError:
        return session.scalars(query).one()


def find_project(session: Session, name_or_id: str) -> Project:
    """A project by id or name (the admin routes take either); 404 if none."""
    project = session.scalar(
        select(Project).where(or_(Project.id == name_or_id, Project.name == name_or_id))
    )
    if project is None:
        raise not_found("project", name_or_id)
    return project


def lock_project(session: Session, project_id: str) -> str:
    """Locks the project's row until the transaction ends; its name.

    What a project's admissions (enqueued limits, quotas) serialize on, so that concurrent
    requests of one project never pass a limit together: `SELECT … FOR UPDATE` on PostgreSQL,
    where SQLite's transactions are already `BEGIN IMMEDIATE`.
    """
    name = session.scalar(select(Project.name).where(Project.id == project_id).with_for_update())
    if name is None:
        raise not_found("project", project_id)
    return name


def create_key(
    session: Session, project_name: str, role: str = "member", name: str = ""
) -> tuple[ApiKey, str]:
    """Create a key; the secret is returned once and only its hash is kept."""
    project = ensure_project(session, project_name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key_"),
        project_id=project.id,
        name=name,
        key_hash=hash_key(secret),
        redacted=secret[:10] + "…" + secret[-4:],
        role=role,
        created_at=int(time.time()),
    )
    session.add(key)
    session.flush()
    return key, secret


def keys_configured(session: Session, settings: Settings) -> bool:
    if settings.admin_key:
        return True
    return (
        session.scalar(select(ApiKey.seq).where(ApiKey.revoked_at.is_(None)).limit(1)) is not None
    )


class Access:
    """Whether callers without a key get in: decided once, at start-up, and it only closes.

    A process that started with keys (or `OVERNIGHT_ADMIN_KEY`) requires them for its
    whole life, whatever happens to the keys table. One that started open closes for
    good as soon as a key exists (this replica's or another's): a data change can
    tighten access, never loosen it.
    """

    def __init__(self, started_open: bool) -> None:
        self.started_open = started_open
        self._open = started_open
        self._open_principal: Principal | None = None

    @classmethod
    def at_startup(cls, session: Session, settings: Settings) -> "Access":
        return cls(started_open=not keys_configured(session, settings))

    @property
    def seen_open(self) -> bool:
        """Whether the API was open when last asked, without a query: it may still say
        open for a while after a key appeared elsewhere, never the other way round."""
        return self._open

    def recheck_open(self, session: Session, settings: Settings) -> bool:
        """Whether callers without a key still get in; a key found closes it for good."""
        if self._open and keys_configured(session, settings):
            self._open = False
        return self._open

    def open_principal(self, session: Session) -> Principal:
        """Whoever calls while the API is open: the default project's admin. Its id is
        read once (a project is never deleted), so an open request costs one query."""
        if self._open_principal is None:
            self._open_principal = Principal(ensure_project(session, DEFAULT_PROJECT).id, "admin")
        return self._open_principal

    def describe(self, session: Session, settings: Settings) -> str:
        """`open` or `keys_required`, for /readyz and the start-up banner."""
        return "open" if self.recheck_open(session, settings) else "keys_required"


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def key_principal(session: Session, settings: Settings, token: str) -> Principal | None:
    """Who `token` is: the configured admin key or an unrevoked key; None for neither."""
    if settings.admin_key and secrets.compare_digest(token, settings.admin_key):
        return Principal(ensure_project(session, DEFAULT_PROJECT).id, "admin")
    key = session.execute(
        select(ApiKey.project_id, ApiKey.role).where(
            ApiKey.key_hash == hash_key(token), ApiKey.revoked_at.is_(None)
        )
    ).first()
    return Principal(key.project_id, key.role) if key is not None else None


def keyless_principal(
    session: Session, settings: Settings, access: Access, token: str | None
) -> Principal:
    """A caller whose token is no key: the default project in open mode, else a 401."""
    if access.recheck_open(session, settings):
        # Open mode: any token (the SDK insists on sending one) is the default project.
        return access.open_principal(session)
    if token is None:
        raise OpenAIError(
            "Missing bearer authentication in header. You need to provide your API key in "
            "an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            status_code=401,
        )
    raise OpenAIError(
        f"Incorrect API key provided: {token[:6]}…. You can create keys with "
        "`overnight keys create --project NAME`.",
        status_code=401,
        code="invalid_api_key",
    )


def authenticate(
    session: Session, settings: Settings, access: Access, authorization: str | None
) -> Principal:
    token = bearer_token(authorization)
    principal = key_principal(session, settings, token) if token is not None else None
    return principal or keyless_principal(session, settings, access, token)
