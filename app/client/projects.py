"""`overnight projects list|weight` (admin API) and the schedule lines of `batches show`."""

import argparse
import time
from typing import Any

import openai

from app.client import output
from app.client.connection import client


def cmd_list(args: argparse.Namespace) -> int:
    page: dict[str, Any] = client(args).get("/admin/projects", cast_to=dict)
    rows = list(page["data"])
    if args.json:
        output.print_json(rows)
        return 0
    output.print_table(
        ["ID", "NAME", "WEIGHT", "CREATED"],
        ((r["id"], r["name"], f"{r['weight']:g}", output.age(r["created_at"])) for r in rows),
        empty="No projects yet.",
    )
    return 0


def cmd_weight(args: argparse.Namespace) -> int:
    body = {"weight": args.weight}
    project: dict[str, Any] = client(args).post(
        f"/admin/projects/{args.project}", body=body, cast_to=dict
    )
    print(f"{project['name']}: weight {project['weight']:g}")
    return 0


def schedule_of(api: openai.OpenAI, batch_id: str) -> dict[str, Any] | None:
    """The batch's place in the schedule (`GET /v1/batches/{id}/schedule`), if the server has it."""
    try:
        found: dict[str, Any] = api.get(f"/batches/{batch_id}/schedule", cast_to=dict)
    except openai.NotFoundError:
        return None
    return found


def _in(ts: float) -> str:
    seconds = max(int(ts - time.time()), 0)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"in {seconds // size}{unit}{seconds % size // (size // 60):02d}"
    return f"in {seconds}s"


def eta_text(found: dict[str, Any] | None) -> str:
    """`finish in 4m05 (at risk)`: the short form the `--wait` line shows."""
    if not found or found.get("estimated_finish_at") is None:
        return ""
    flags = " (expected to miss its deadline)" if found["expected_to_miss"] else ""
    flags = flags or (" (at risk: served first)" if found["at_risk"] else "")
    return f"finish {_in(found['estimated_finish_at'])}{flags}"


def schedule_rows(found: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The rows `batches show` adds for a queued or running batch."""
    if not found or found.get("estimated_finish_at") is None:
        return []
    rows = [
        ("estimated start", output.when(found["estimated_start_at"])),
        ("estimated finish", output.when(found["estimated_finish_at"])),
    ]
    if found.get("position") is not None:
        rows.append(("schedule position", str(found["position"])))
    if found["expected_to_miss"]:
        rows.append(("deadline", "expected to miss expires_at"))
    elif found["at_risk"]:
        rows.append(("deadline", "at risk: served ahead of fair share"))
    return rows
