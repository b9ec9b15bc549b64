"""`overnight projects list|weight|limits|limit|quotas|quota` (admin API) and the schedule
lines of `batches show`."""

import argparse
import time
from typing import Any

import openai

from app.client import output
from app.client.arguments import DEFAULT, QUOTAS, quota_option
from app.client.connection import CliError, client


def cmd_list(args: argparse.Namespace) -> int:
    page: dict[str, Any] = client(args).get("/admin/projects", cast_to=dict)
    rows = list(page["data"])
    return output.print_listing(
        args.json,
        rows,
        ["ID", "NAME", "WEIGHT", "CREATED"],
        ((r["id"], r["name"], f"{r['weight']:g}", output.age(r["created_at"])) for r in rows),
        empty="No projects yet.",
    )


def cmd_weight(args: argparse.Namespace) -> int:
    body = {"weight": args.weight}
    project: dict[str, Any] = client(args).post(
        f"/admin/projects/{args.project}", body=body, cast_to=dict
    )
    print(f"{project['name']}: weight {project['weight']:g}")
    return 0


def _limit_text(limit: int | None, own: int | None, unit: str) -> str:
    shown = f"{limit:,} {unit}" if limit is not None else f"unlimited {unit}"
    return f"{shown} ({'own' if own is not None else DEFAULT})"


def cmd_limits(args: argparse.Namespace) -> int:
    page: dict[str, Any] = client(args).get(f"/admin/projects/{args.project}/limits", cast_to=dict)
    rows = list(page["data"])
    return output.print_listing(
        args.json,
        rows,
        ["MODEL", "ENQUEUED TOKENS", "ENQUEUED REQUESTS"],
        (
            (
                r["model"],
                _limit_text(r["token_limit"], r["token_limit_override"], "tokens"),
                _limit_text(r["request_limit"], r["request_limit_override"], "requests"),
            )
            for r in rows
        ),
        empty="No models.",
    )


def cmd_limit(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"model": args.model}
    for option, field in (("tokens", "token_limit"), ("requests", "request_limit")):
        if hasattr(args, option):
            body[field] = getattr(args, option)
    if len(body) == 1:
        raise CliError("give --tokens or --requests (a number, or `default`)")
    found: dict[str, Any] = client(args).post(
        f"/admin/projects/{args.project}/limits", body=body, cast_to=dict
    )
    tokens = _limit_text(found["token_limit"], found["token_limit_override"], "tokens")
    requests = _limit_text(found["request_limit"], found["request_limit_override"], "requests")
    print(f"{found['project_name']} on {found['model']}: {tokens}, {requests}")
    return 0


def _quota_text(quota: dict[str, Any], unit: str) -> str:
    return _limit_text(quota["limit"], quota["override"], unit)


def cmd_quotas(args: argparse.Namespace) -> int:
    found: dict[str, Any] = client(args).get(f"/admin/projects/{args.project}/quotas", cast_to=dict)
    return output.print_listing(
        args.json,
        found,
        ["QUOTA", "IN USE", "LIMIT"],
        (
            (unit, f"{found[field]['used']:,}", _quota_text(found[field], unit))
            for field, unit in QUOTAS
        ),
        empty="No quotas.",
    )


def cmd_quota(args: argparse.Namespace) -> int:
    body = {f"max_{field}": getattr(args, field) for field, _unit in QUOTAS if hasattr(args, field)}
    if not body:
        options = ", ".join(quota_option(field) for field, _unit in QUOTAS)
        raise CliError(f"give one of {options} (a number, or `default`)")
    found: dict[str, Any] = client(args).post(
        f"/admin/projects/{args.project}/quotas", body=body, cast_to=dict
    )
    shown = ", ".join(_quota_text(found[field], unit) for field, unit in QUOTAS)
    print(f"{found['project_name']}: {shown}")
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
