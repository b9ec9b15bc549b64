"""The progress bar on stderr, from the batch's persisted counts."""

import asyncio

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch
from app.db.session import session_scope
from app.schemas.batches import BatchObject
from app.services import batches

POLL_SECONDS = 0.5


def batch_row(settings: Settings, batch_id: str) -> BatchObject:
    with session_scope(settings) as session:
        project_id = session.scalars(select(Batch.project_id).where(Batch.id == batch_id)).one()
        return batches.get_batch(session, project_id, batch_id)


async def follow(settings: Settings, batch_id: str, stop: asyncio.Event) -> None:
    """Shows progress; sets `stop` (the worker's) once the batch has ended."""
    columns = (
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    # Redrawn as often as the counts are read: rich's default, 10 a second, redraws
    # unchanged counts (about 1% of a core while a batch runs, as py-spy sampled it).
    refresh = 1 / POLL_SECONDS
    with Progress(*columns, console=Console(stderr=True), refresh_per_second=refresh) as bar:
        task = bar.add_task("run-batch", total=None, status="", counts="")
        while True:
            batch = await asyncio.to_thread(batch_row, settings, batch_id)
            counts = batch.request_counts
            bar.update(
                task,
                total=counts.total or None,
                completed=counts.completed + counts.failed,
                status=batch.status,
                counts=f"{counts.completed} ok, {counts.failed} failed, "
                f"{batch.usage.output_tokens} tokens out",
            )
            if batch.status in TERMINAL_BATCH_STATUSES:
                stop.set()
                return
            if stop.is_set():
                return
            await asyncio.sleep(POLL_SECONDS)
