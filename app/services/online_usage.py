"""Online API usage by project and model: workers add to it; `/metrics`, the dashboard read it."""

import time
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import upsert
from app.db.models import OnlineUsage, Project

COUNTERS = ("requests", "input_tokens", "cached_tokens", "output_tokens")


@dataclass(frozen=True)
class UsageRow:
    project: str  # the project's name
    model: str
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int


def add(session: Session, model: str, by_project: Mapping[str, object]) -> None:
    """Adds each project's counts (objects with the COUNTERS attributes) in one statement each.

    An upsert that adds, so that workers recording at once never lose each other's counts.
    """
    now = time.time()
    for project_id, used in by_project.items():
        values = {name: int(getattr(used, name)) for name in COUNTERS}
        statement = upsert.insert(session, OnlineUsage).values(
            project_id=project_id, model=model, updated_at=now, **values
        )
        added = {name: getattr(OnlineUsage, name) + statement.excluded[name] for name in COUNTERS}
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["project_id", "model"], set_={**added, "updated_at": now}
            )
        )


def totals(session: Session) -> list[UsageRow]:
    """Every project's online usage by model, by project name then model."""
    rows = session.execute(
        select(Project.name, OnlineUsage)
        .join(Project, Project.id == OnlineUsage.project_id)
        .order_by(Project.name, OnlineUsage.model)
    ).all()
    return [
        UsageRow(name, u.model, u.requests, u.input_tokens, u.cached_tokens, u.output_tokens)
        for name, u in rows
    ]
