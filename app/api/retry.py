"""A batch's retry across its transactions, for the API's route and the dashboard's action."""

import asyncio
from functools import partial

from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.schemas.batches import BatchObject
from app.services import batch_retry
from app.services.housekeeping import VALIDATION, wake
from app.services.unrecorded_bytes import delete_unless_file
from app.storage import Storage


async def run_retry(
    uow: UnitOfWork,
    settings: Settings,
    storage: Storage,
    project_id: str | None,
    batch_id: str,
    include_all: bool,
) -> BatchObject:
    """The retry's three steps (the API's and the dashboard's): plan, write the input, create."""
    plan = await uow.run(batch_retry.plan_retry, project_id, batch_id)
    written = await asyncio.to_thread(batch_retry.write_retry_input, storage, plan, include_all)
    batch = await uow.run_or_undo(
        partial(delete_unless_file, settings, storage, written.file_id, written.stored.key),
        batch_retry.create_retry,
        settings,
        plan,
        written,
    )
    wake(settings, VALIDATION)
    return batch
