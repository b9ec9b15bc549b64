"""The schedule's state in the database: fair-share clocks, weights, the planner's pass, ETAs.

The claim itself (`worker/claim.py`) only reads what is kept here: each project's clock on a
model (`project_shares.vtime`, work served / weight), each batch's clock inside its project
(`batch_schedules.vtime`) and the planner's verdict `batch_schedules.urgent_deadline`.
Checkpoints move the clocks (`record_work`); `admit` creates the batch's schedule row and sets
its clock when the batch starts; `replan` runs in the API's housekeeping and writes every open
batch's estimated start and finish (a model no worker runs now starts when a switching worker
would load it, `app.core.switching`). None of them writes the `batches` row.
"""

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.core.schedule import Demand, Estimate, Order, plan, recorded_speed
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.core.switching import wait_for
from app.db import upsert
from app.db.models import Batch, BatchSchedule, Project, ProjectShare, RegisteredWorker, Shard
from app.errors import not_found
from app.schemas.admin import ProjectObject, ScheduledBatchObject
from app.schemas.models import SWITCHING_KEY
from app.services.auth import find_project
from app.services.result_series import recent_results

# A model's speed is the work its workers finished over this many seconds.
SPEED_WINDOW_SECONDS = 60.0
# A model a switching worker may load runs at the speed it had over this window.
SWITCHED_SPEED_WINDOW_SECONDS = 3600.0
# A switching worker counts for the plan while its heartbeat is this fresh.
SWITCHING_WORKER_SEEN_SECONDS = 60.0
# A schedule row's estimate is rewritten only when it moved by more than this (or a flag did).
ETA_TOLERANCE_SECONDS = 1.0


def _share_insert(session: Session, project_id: str, model: str) -> None:
    """The (project, model) clock row, created once even under concurrent creators."""
    values = {"project_id": project_id, "model": model, "vtime": 0.0, "work_done": 0}
    session.execute(upsert.insert(session, ProjectShare).values(values).on_conflict_do_nothing())


def _schedule_row(session: Session, batch_id: str) -> BatchSchedule:
    """The batch's schedule row, created if it has none (one from before the table was)."""
    found = session.get(BatchSchedule, batch_id)
    if found is None:
        found = BatchSchedule(batch_id=batch_id, work_done=0, vtime=0.0)
        session.add(found)
    return found


def admit(session: Session, batch: Batch) -> None:
    """A batch starts running: its schedule row, with clocks so neither idle time nor age is
    banked. Every batch that can be claimed went through here.

    The batch starts at the lowest clock of its project's other running batches; a project
    with no other running batch on the model starts at the lowest clock of the projects that
    have one (it gets its share from now on, not a backlog of what it did not use).
    """
    clock = _schedule_row(session, batch.id)
    if batch.model is None:
        return
    _share_insert(session, batch.project_id, batch.model)
    running = (
        Batch.status == BatchStatus.IN_PROGRESS,
        Batch.model == batch.model,
        Batch.id != batch.id,
    )
    siblings = session.scalar(
        select(func.min(BatchSchedule.vtime))
        .join(Batch, Batch.id == BatchSchedule.batch_id)
        .where(*running, Batch.project_id == batch.project_id)
    )
    clock.vtime = float(siblings or 0.0)
    if siblings is not None:
        return
    others = session.scalar(
        select(func.min(ProjectShare.vtime))
        .join(
            Batch,
            (Batch.project_id == ProjectShare.project_id) & (Batch.model == ProjectShare.model),
        )
        .where(*running)
    )
    if others is not None:
        session.execute(
            update(ProjectShare)
            .where(ProjectShare.project_id == batch.project_id, ProjectShare.model == batch.model)
            .values(vtime=others)
        )


def record_work(session: Session, batch_id: str, work: int) -> tuple[BatchStatus, int]:
    """Adds a checkpoint's work to the batch's and its project's clocks; the batch's state.

    Writes the batch's schedule row and its project's share row, never the `batches` row
    (read, not locked: every worker on a batch would queue on it). Rows are locked
    shard → batch schedule → project share, in that order on every path; a checkpoint that
    closes its shard locks the batch row before the shard (`worker.claim.checkpoint`).
    """

    def of_batch(column: Any) -> Any:
        return select(column).where(Batch.id == batch_id).scalar_subquery()

    status, expires_at, project_id, model = session.execute(
        update(BatchSchedule)
        .where(BatchSchedule.batch_id == batch_id)
        .values(work_done=BatchSchedule.work_done + work, vtime=BatchSchedule.vtime + work)
        .returning(  # one round trip
            of_batch(Batch.status),
            of_batch(Batch.expires_at),
            of_batch(Batch.project_id),
            of_batch(Batch.model),
        )
        .execution_options(synchronize_session=False)
    ).one()
    if model is not None:
        weight = select(Project.weight).where(Project.id == project_id).scalar_subquery()
        session.execute(
            update(ProjectShare)
            .where(ProjectShare.project_id == project_id, ProjectShare.model == model)
            .values(
                work_done=ProjectShare.work_done + work,
                vtime=ProjectShare.vtime + work / weight,
            )
        )
    return status, expires_at


# -- weights --


def to_project_object(project: Project) -> ProjectObject:
    return ProjectObject(
        id=project.id, name=project.name, created_at=project.created_at, weight=project.weight
    )


def set_weight(session: Session, name_or_id: str, weight: float) -> ProjectObject:
    """A project's fair-share weight (by id or name); its clock counts from now at the new rate."""
    project = find_project(session, name_or_id)
    project.weight = weight
    return to_project_object(project)


# -- the planner --


def _speeds(session: Session, now: float, window: float = SPEED_WINDOW_SECONDS) -> dict[str, float]:
    """Work per second each model's workers finished over the last window, the work of
    batches that ended in it included."""
    recorded: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for result in recent_results(session, now - window):
        if result.model is not None:
            recorded[result.model].append((float(result.at), float(result.work)))
    speeds = {model: recorded_speed(records) for model, records in recorded.items()}
    return {model: speed for model, speed in speeds.items() if speed > 0}


def _switched_to(
    session: Session, models: list[str], speeds: dict[str, float], now: float
) -> dict[str, tuple[float, float]]:
    """For models no worker runs now but a switching worker may load: the speed they ran at
    over the last hour, and when the soonest such worker would start them."""
    soonest: dict[str, float] = {}
    workers = select(RegisteredWorker.engine_configuration, RegisteredWorker.ready_at).where(
        RegisteredWorker.stopped_at.is_(None),
        RegisteredWorker.heartbeat_at >= now - SWITCHING_WORKER_SEEN_SECONDS,
    )
    for configuration, ready_at in session.execute(workers) if models else ():
        shown = (configuration or {}).get(SWITCHING_KEY)
        if shown is None:
            continue
        held_for, busy = now - (ready_at or now), speeds.get(shown["holding"], 0.0) > 0
        for model in models:
            wait = wait_for(shown, model, held_for, busy)
            if wait is not None:
                soonest[model] = min(soonest.get(model, wait), wait)
    known = _speeds(session, now, SWITCHED_SPEED_WINDOW_SECONDS) if soonest else {}
    return {m: (known[m], now + wait) for m, wait in soonest.items() if m in known}


def _open_batches(session: Session) -> list[Any]:
    done = func.sum(Shard.completed + Shard.failed).label("done")
    return list(
        session.execute(
            select(
                Batch.id,
                Batch.project_id,
                Project.weight,
                Batch.seq,
                Batch.model,
                Batch.expires_at,
                Batch.total,
                BatchSchedule.work_done,
                BatchSchedule.urgent_deadline,
                BatchSchedule.expected_miss,
                BatchSchedule.eta_start_at,
                BatchSchedule.eta_finish_at,
                done,
                func.max(Shard.attempts).label("attempts"),
            )
            .join(Project, Project.id == Batch.project_id)
            .join(BatchSchedule, BatchSchedule.batch_id == Batch.id)
            .join(Shard, Shard.batch_id == Batch.id)
            .where(Batch.status == BatchStatus.IN_PROGRESS, Batch.model.is_not(None))
            .group_by(Batch.seq, Project.weight, BatchSchedule.batch_id)
        ).all()
    )


def _demands(rows: Sequence[Any]) -> list[Demand]:
    """Each batch's work left: requests left times its work per request (else its model's)."""
    work = sum(r.work_done for r in rows)
    done = sum(r.done or 0 for r in rows)
    mean = work / done if done else 1.0
    return [
        Demand(
            batch_id=r.id,
            project_id=r.project_id,
            weight=r.weight,
            seq=r.seq,
            expires_at=float(r.expires_at),
            remaining_work=max(r.total - (r.done or 0), 0)
            * (r.work_done / r.done if r.done else mean),
            started=bool(r.attempts),
            at_risk=r.urgent_deadline is not None,
        )
        for r in rows
    ]


def replan(session: Session, order: Order, now: float | None = None) -> list[Estimate]:
    """One planner pass over every model: at-risk flags and ETAs."""
    now = time.time() if now is None else now
    speeds = _speeds(session, now)
    by_model: dict[str, list[Any]] = defaultdict(list)
    for row in _open_batches(session):
        by_model[row.model].append(row)
    waiting = _switched_to(session, [m for m in by_model if m not in speeds], speeds, now)
    estimates: list[Estimate] = []
    for model, rows in by_model.items():
        speed, start = waiting.get(model, (speeds.get(model, 0.0), now))
        estimates += plan(_demands(rows), order, speed, start)
    _store(session, estimates, {r.id: r for rows in by_model.values() for r in rows}, now)
    return estimates


def _changed(row: Any, e: Estimate) -> bool:
    """Whether the stored estimate is off by more than the tolerance, or a flag changed."""
    if (row.urgent_deadline is not None, row.expected_miss) != (e.at_risk, e.expected_miss):
        return True
    if row.eta_start_at is None or row.eta_finish_at is None:
        return True
    moved = max(abs(row.eta_start_at - e.start_at), abs(row.eta_finish_at - e.finish_at))
    return moved > ETA_TOLERANCE_SECONDS


def _store(
    session: Session, estimates: Iterable[Estimate], rows: dict[str, Any], now: float
) -> None:
    """Writes the estimates that changed, to the schedule rows only (in batch order)."""
    for e in sorted(estimates, key=lambda e: rows[e.batch_id].seq):
        row = rows[e.batch_id]
        if _changed(row, e):
            running = select(Batch.id).where(
                Batch.id == e.batch_id, Batch.status == BatchStatus.IN_PROGRESS
            )
            session.execute(
                update(BatchSchedule)
                .where(BatchSchedule.batch_id.in_(running))
                .values(
                    eta_start_at=e.start_at,
                    eta_finish_at=e.finish_at,
                    eta_made_at=now,
                    expected_miss=e.expected_miss,
                    urgent_deadline=row.expires_at if e.at_risk else None,
                )
            )


# -- views --


def _scheduled(
    batch: Batch, planned: BatchSchedule | None, project_name: str, position: int | None
) -> ScheduledBatchObject:
    """`planned` None: the batch was not admitted (validating, or failed validation)."""
    open_ = batch.status not in TERMINAL_BATCH_STATUSES and batch.status != BatchStatus.FINALIZING
    shown = planned if open_ else None
    return ScheduledBatchObject(
        batch_id=batch.id,
        project_id=batch.project_id,
        project_name=project_name,
        model=batch.model,
        status=batch.status,
        position=position if open_ else None,
        at_risk=shown is not None and shown.urgent_deadline is not None,
        expected_to_miss=shown is not None and shown.expected_miss,
        expires_at=batch.expires_at,
        estimated_start_at=shown.eta_start_at if shown else None,
        estimated_finish_at=shown.eta_finish_at if shown else None,
        estimated_at=shown.eta_made_at if shown else None,
    )


def _with_schedules(*where: Any) -> Any:
    """Batches with their schedule row (None before admission) and project name."""
    return (
        select(Batch, BatchSchedule, Project.name)
        .join(Project, Project.id == Batch.project_id)
        .outerjoin(BatchSchedule, BatchSchedule.batch_id == Batch.id)
        .where(*where)
    )


def _start_at(planned: BatchSchedule | None) -> float | None:
    return None if planned is None else planned.eta_start_at


def schedule_objects(session: Session, project_id: str | None = None) -> list[ScheduledBatchObject]:
    """Open batches in the order the planner expects to serve them, per model."""
    open_ = Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS))
    rows = session.execute(_with_schedules(open_)).all()
    ranked = sorted(
        rows,
        key=lambda r: (
            r[0].model or "",
            _start_at(r[1]) is None,
            _start_at(r[1]) or 0,
            r[0].seq,
        ),
    )
    positions: dict[str | None, int] = defaultdict(int)
    result = []
    for batch, planned, name in ranked:
        positions[batch.model] += 1
        if project_id is None or batch.project_id == project_id:
            known = _start_at(planned) is not None
            position = positions[batch.model] if known else None
            result.append(_scheduled(batch, planned, name, position))
    return result


def scheduled_batch(
    session: Session, batch_id: str, project_id: str | None
) -> ScheduledBatchObject:
    """One batch's place in the schedule; `project_id` None for an admin."""
    found = next((s for s in schedule_objects(session) if s.batch_id == batch_id), None)
    if found is not None and project_id in (None, found.project_id):
        return found
    row = session.execute(_with_schedules(Batch.id == batch_id)).first()
    if row is None or project_id not in (None, row[0].project_id):
        raise not_found("batch", batch_id)
    return _scheduled(row[0], row[1], row[2], None)


def schedule_of(session: Session, batch_id: str) -> BatchSchedule | None:
    """The batch's schedule row; None before it was admitted."""
    return session.get(BatchSchedule, batch_id)
