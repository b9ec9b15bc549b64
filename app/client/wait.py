"""Following a batch to its end with a live progress bar."""

import time

import openai
from openai.types import Batch, BatchRequestCounts
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.client import output
from app.client.projects import eta_text, schedule_of

TERMINAL = ("completed", "failed", "expired", "cancelled")


def wait_for(api: openai.OpenAI, batch_id: str, interval: float = 1.0) -> Batch:
    """Polls until the batch ends; Ctrl-C stops waiting, not the batch."""
    columns = (
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]} · {task.fields[rate]}{task.fields[eta]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=output.errors) as bar:
            task = bar.add_task(
                "batch", total=None, status="validating", counts="", rate="", eta=""
            )
            while True:
                batch = api.batches.retrieve(batch_id)
                counts = batch.request_counts or BatchRequestCounts(completed=0, failed=0, total=0)
                done = counts.completed + counts.failed
                eta = "" if batch.status in TERMINAL else eta_text(schedule_of(api, batch_id))
                bar.update(
                    task,
                    total=counts.total or None,
                    completed=done,
                    status=batch.status,
                    counts=output.outcomes(batch),
                    rate=str(output.throughput(batch)),
                    eta=f" · {eta}" if eta else "",
                )
                if batch.status in TERMINAL:
                    return batch
                time.sleep(interval)
    except KeyboardInterrupt:
        output.errors.print(
            f"stopped waiting; {batch_id} goes on. Later: overnight batches download {batch_id}",
            markup=False,
        )
        raise SystemExit(130) from None
