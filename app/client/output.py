"""What the CLI prints: tables for people, JSON for scripts."""

import json
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.core.progress import Outcomes
from app.core.throughput import Throughput, batch_throughput

if TYPE_CHECKING:  # the SDK takes a second to import: local commands never need it
    from openai.types import Batch

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)


def when(ts: int | float | None) -> str:
    """Local time with its zone, so that a pasted line means the same to everyone."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def age(ts: int | float | None) -> str:
    if ts is None:
        return ""
    seconds = int(time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def throughput(batch: "Batch", waited: float = 0.0) -> Throughput:
    """The batch's throughput as the dashboard and `/metrics` show it, less `waited`: seconds
    it was seen waiting for a worker (`app.client.waiting`)."""
    usage, counts = batch.usage, batch.request_counts
    return batch_throughput(
        batch,
        time.time(),
        input_tokens=usage.input_tokens if usage else 0,
        output_tokens=usage.output_tokens if usage else 0,
        completed=counts.completed if counts else 0,
        waited=waited,
    )


def throughput_text(batch: "Batch", waited: float = 0.0) -> str:
    """ "41.3 tok/s (waited 80 s for a worker, left out)": the rate, and what it leaves out."""
    rate = str(throughput(batch, waited))
    return f"{rate} (waited {waited:.0f} s for a worker, left out)" if waited >= 0.5 else rate


def outcomes(batch: "Batch") -> str:
    """ "22 ok, 0 failed, 378 cancelled": the request counts with the unrun apart."""
    counts = batch.request_counts
    if counts is None:
        return ""
    extra = counts.model_extra or {}
    return str(
        Outcomes.of_counts(
            counts.completed, counts.failed, extra.get("cancelled", 0), extra.get("expired", 0)
        )
    )


def print_json(items: BaseModel | dict[str, Any] | Sequence[BaseModel | dict[str, Any]]) -> None:
    def plain(item: BaseModel | dict[str, Any]) -> Any:
        return item.model_dump(mode="json") if isinstance(item, BaseModel) else item

    data = [plain(i) for i in items] if isinstance(items, Sequence) else plain(items)
    # Not rich's print_json: user strings must come out verbatim, with no markup parsing.
    print(json.dumps(data, indent=2, ensure_ascii=False))


def print_listing(
    as_json: bool,
    found: BaseModel | dict[str, Any] | Sequence[BaseModel | dict[str, Any]],
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    empty: str,
) -> int:
    """`found` as JSON for a script, else as a table of `rows`; the command's exit status."""
    if as_json:
        print_json(found)
    else:
        print_table(columns, rows, empty)
    return 0


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
    rows = list(rows)
    if not rows:
        errors.print(empty, markup=False)
        return
    table = Table(*columns, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        # Cells are user data (filenames, metadata): Text is never parsed as rich markup.
        table.add_row(*(Text(str(cell)) for cell in row))
    table.columns[0].no_wrap = True  # ids are copied from here: never fold them
    # A terminal folds long cells to fit; a pipe or file gets whole lines.
    Console(highlight=False, width=None if sys.stdout.isatty() else 100_000).print(table)
