"""Following a batch to its end with a live progress bar."""

import time
from dataclasses import dataclass

import openai
from openai.types import Batch, BatchRequestCounts
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.client import output
from app.client.projects import eta_text, schedule_of
from app.client.waiting import WaitClock, may_wait_for_a_worker, workers_of
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus

WAITING = "waiting for a worker"


@dataclass(frozen=True)
class Followed:
    """A batch followed to its end, and the seconds it was seen waiting for a worker."""

    batch: Batch
    waited: float


class _Watch:
    """One poll's view of the batch: its status as a person should read it."""

    def __init__(self, api: openai.OpenAI) -> None:
        self.api = api
        self.clock = WaitClock()
        self.fleet_visible = True
        self.told = False

    def status(self, batch: Batch) -> str:
        workers = None
        if self.fleet_visible and batch.model and may_wait_for_a_worker(batch):
            workers = workers_of(self.api, batch.model)
            self.fleet_visible = workers is not None
        waiting = workers is not None and workers.serving == 0
        self.clock.saw(waiting, time.monotonic())
        if workers is not None and waiting and not self.told:
            output.errors.print(workers.describe(batch.model or ""), markup=False)
            self.told = True
        return WAITING if waiting else batch.status


def wait_for(api: openai.OpenAI, batch_id: str, interval: float = 1.0) -> Followed:
    """Polls until the batch ends; Ctrl-C stops waiting, not the batch."""
    columns = (
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]} · {task.fields[rate]}{task.fields[eta]}"),
        TimeElapsedColumn(),
    )
    watch = _Watch(api)
    try:
        with Progress(*columns, console=output.errors) as bar:
            task = bar.add_task(
                "batch", total=None, status=BatchStatus.VALIDATING.value, counts="", rate="", eta=""
            )
            while True:
                batch = api.batches.retrieve(batch_id)
                counts = batch.request_counts or BatchRequestCounts(completed=0, failed=0, total=0)
                status = watch.status(batch)
                ended = batch.status in TERMINAL_BATCH_STATUSES
                eta = "" if ended else eta_text(schedule_of(api, batch_id))
                bar.update(
                    task,
                    total=counts.total or None,
                    completed=counts.completed + counts.failed,
                    status=status,
                    counts=output.outcomes(batch),
                    rate=str(output.throughput(batch, watch.clock.seconds)),
                    eta=f" · {eta}" if eta and status != WAITING else "",
                )
                if batch.status in TERMINAL_BATCH_STATUSES:
                    return Followed(batch, watch.clock.seconds)
                time.sleep(interval)
    except KeyboardInterrupt:
        output.errors.print(
            f"stopped waiting; {batch_id} goes on. Later: overnight batches download {batch_id}",
            markup=False,
        )
        raise SystemExit(130) from None
