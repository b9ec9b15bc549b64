"""Per-project quotas: the bytes a project stores, its files, open uploads and unfinished
batches, so that one tenant cannot fill the store or the queues for the others.

Unlimited by default; `OVERNIGHT_PROJECT_MAX_*` set them for every project, and an admin gives
a project its own (`projects.max_*`, `POST /v1/admin/projects/{p}/quotas`), as with the
enqueued limits. Each is checked in the transaction that creates the object, after the
project's row is locked (`lock_project`, the lock enqueued admission takes), so concurrent
requests of one project never pass a quota together, and a refused request keeps nothing.

Only what a client asks for is refused. What the server writes for a batch (its output and
error files) always goes in and may take a project past its quota; its next file is refused
then, until it deletes some.
"""

import time
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, File, Project, Upload, UploadPart
from app.errors import OpenAIError
from app.schemas.admin import ProjectQuotasObject, Quota, QuotaObject, UpdateProjectQuotasRequest
from app.schemas.uploads import UploadStatus
from app.services.auth import find_project, lock_project
from app.services.files import visible

_UNITS = {
    Quota.STORED_BYTES: "bytes",
    Quota.FILES: "files",
    Quota.OPEN_UPLOADS: "open uploads",
    Quota.UNFINISHED_BATCHES: "unfinished batches",
}
_REMEDIES = {
    Quota.STORED_BYTES: "Delete files or cancel uploads to make room",
    Quota.FILES: "Delete files to make room",
    Quota.OPEN_UPLOADS: "Complete or cancel an open upload first",
    Quota.UNFINISHED_BATCHES: "Wait for a batch to end, or cancel one",
}

Usage = dict[Quota, int]


def column(quota: Quota) -> str:
    """The `projects` column of a project's own quota (and the admin request's field)."""
    return f"max_{quota}"


def setting(settings: Settings, quota: Quota) -> str:
    """The environment variable of the deployment's quota."""
    prefix = settings.model_config.get("env_prefix", "")
    return f"{prefix}project_max_{quota}".upper()


def limit_of(settings: Settings, project: Project, quota: Quota) -> int | None:
    """The project's quota in force: its own, else the deployment's; None: no limit."""
    own: int | None = getattr(project, column(quota))
    default: int | None = getattr(settings, f"project_max_{quota}")
    return own if own is not None else default


# -- what projects hold --


def open_upload(now: int) -> list[ColumnElement[bool]]:
    """SQL conditions: the upload still takes parts at `now` (`uploads.status_of`)."""
    return [Upload.status == UploadStatus.PENDING, Upload.expires_at > now]


def _measures(quota: Quota, ids: Sequence[str], now: int) -> list[Select[str, int]]:
    """Statements of `(project id, amount)` rows whose amounts add up to what each holds."""
    files = select(File.project_id).where(File.project_id.in_(ids), *visible(now))
    files = files.group_by(File.project_id)
    uploads = select(Upload.project_id).where(Upload.project_id.in_(ids), *open_upload(now))
    uploads = uploads.group_by(Upload.project_id)
    if quota is Quota.STORED_BYTES:
        parts = uploads.join(UploadPart, UploadPart.upload_id == Upload.id)
        return [
            files.add_columns(func.sum(File.bytes)),
            parts.add_columns(func.sum(UploadPart.bytes)),
        ]
    if quota is Quota.FILES:
        return [files.add_columns(func.count())]
    if quota is Quota.OPEN_UPLOADS:
        return [uploads.add_columns(func.count())]
    unfinished = Batch.status.not_in(TERMINAL_BATCH_STATUSES)
    batches = select(Batch.project_id, func.count()).where(Batch.project_id.in_(ids), unfinished)
    return [batches.group_by(Batch.project_id)]


def usage(
    session: Session, project_ids: Sequence[str], quotas: Iterable[Quota]
) -> dict[str, Usage]:
    """What each project holds of `quotas` now."""
    now, wanted = int(time.time()), tuple(quotas)
    held = {project_id: dict.fromkeys(wanted, 0) for project_id in project_ids}
    for quota in wanted:
        for statement in _measures(quota, project_ids, now):
            for project_id, amount in session.execute(statement).all():
                held[project_id][quota] += int(amount or 0)
    return held


# -- checks --


def _project(session: Session, project_id: str) -> Project:
    return session.scalars(select(Project).where(Project.id == project_id)).one()


def exceeded(
    settings: Settings, project: Project, quota: Quota, limit: int, used: int, adding: str
) -> OpenAIError:
    """The refusal: the quota, where it comes from, what the project holds and what changes it."""
    name, env = project.name, setting(settings, quota)
    source = "its own quota" if getattr(project, column(quota)) is not None else env
    return OpenAIError(
        f"Quota exceeded: project {name} may hold at most {limit:,} {_UNITS[quota]} ({source}) "
        f"and holds {used:,}; this request adds {adding}. {_REMEDIES[quota]}, or have an admin "
        f"raise the quota: POST /v1/admin/projects/{name}/quotas (`overnight projects quota`) "
        f"for this project, {env} for every project.",
        status_code=429,
        code="quota_exceeded",
        type="insufficient_quota",
        # Waiting does not help: something must be deleted, ended or allowed first.
        headers={"x-should-retry": "false"},
    )


def check(
    session: Session, settings: Settings, project_id: str, adding: Mapping[Quota, int]
) -> None:
    """Refuses (429 `quota_exceeded`) what would take the project past a quota by `adding`.

    Runs in the transaction that creates the object; it locks the project's row, but only
    when one of these quotas applies.
    """
    project = _project(session, project_id)
    limits = {q: limit for q in adding if (limit := limit_of(settings, project, q)) is not None}
    if not limits:
        return
    lock_project(session, project_id)
    held = usage(session, [project_id], limits)[project_id]
    for quota, limit in limits.items():
        if held[quota] + adding[quota] > limit:
            raise exceeded(settings, project, quota, limit, held[quota], f"{adding[quota]:,}")


def room(
    session: Session, settings: Settings, project_id: str, quota: Quota
) -> tuple[int, OpenAIError] | None:
    """How much more of `quota` the project may take now, and the refusal past it; None: no
    limit. For refusing bytes while they stream in; `check` decides when they are recorded."""
    project = _project(session, project_id)
    limit = limit_of(settings, project, quota)
    if limit is None:
        return None
    used = usage(session, [project_id], [quota])[project_id][quota]
    left = max(limit - used, 0)
    return left, exceeded(settings, project, quota, limit, used, f"more than {left:,}")


# -- the admin's view --


def quota_objects(
    session: Session, settings: Settings, projects: Sequence[Project]
) -> list[ProjectQuotasObject]:
    """Each project's quotas in force, its own, and what it holds."""
    held = usage(session, [p.id for p in projects], Quota)
    return [_quotas_object(settings, p, held[p.id]) for p in projects]


def _quotas_object(settings: Settings, project: Project, held: Usage) -> ProjectQuotasObject:
    fields = {
        quota.value: QuotaObject(
            used=held[quota],
            limit=limit_of(settings, project, quota),
            override=getattr(project, column(quota)),
        )
        for quota in Quota
    }
    return ProjectQuotasObject.model_validate(
        {"project_id": project.id, "project_name": project.name, **fields}
    )


def project_quotas(session: Session, settings: Settings, name_or_id: str) -> ProjectQuotasObject:
    [found] = quota_objects(session, settings, [find_project(session, name_or_id)])
    return found


def set_quotas(
    session: Session, settings: Settings, name_or_id: str, change: UpdateProjectQuotasRequest
) -> ProjectQuotasObject:
    """Sets the quotas `change` carries (null: back to the default); the project's after.

    What the project holds stays; the next request that would add past a quota is refused.
    """
    project = find_project(session, name_or_id)
    for quota in Quota:
        if column(quota) in change.model_fields_set:
            setattr(project, column(quota), getattr(change, column(quota)))
    session.flush()
    [found] = quota_objects(session, settings, [project])
    return found
