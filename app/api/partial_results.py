"""A page of a batch's results so far, across its two steps: find the source, read it."""

import asyncio

from app.api.unit_of_work import UnitOfWork
from app.core.states import BatchApi
from app.services import partial_results
from app.services.partial_results import ResultsPage
from app.storage import Storage


async def results_page(
    uow: UnitOfWork,
    storage: Storage,
    scope: str | None,
    batch_id: str,
    api: BatchApi | None,
    after: str | None,
    limit: int,
) -> ResultsPage:
    """No transaction stays open while objects are read; a chunk gone meanwhile is read
    again from the files if the batch has just ended (its finalizer deletes them)."""
    source = await uow.run(partial_results.locate, scope, batch_id, api, after, limit)
    page = await asyncio.to_thread(partial_results.read, storage, source, limit)
    if page.missing_chunk:
        again = await uow.run(partial_results.locate, scope, batch_id, api, after, limit)
        if again.ended:
            page = await asyncio.to_thread(partial_results.read, storage, again, limit)
    return page
