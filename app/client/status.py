"""`overnight status`: the deployment at a glance, from `GET /v1/admin/stats`."""

import argparse
from typing import Any

from app.client import output
from app.client.connection import client


def _states(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "none"


def cmd_status(args: argparse.Namespace) -> int:
    stats: dict[str, Any] = client(args).get("/admin/stats", cast_to=dict)
    if args.json:
        output.print_json(stats)
        return 0
    batches = ", ".join(f"{n} {status}" for status, n in sorted(stats["batches"].items()))
    print(f"batches: {batches or 'none'}")
    print(f"workers: {_states(stats['workers'])}, {stats['tokens_per_second']:.1f} tok/s")
    output.print_table(
        ["MODEL", "QUEUED", "RUNNING", "VALIDATING", "WORKERS"],
        (
            (
                m["model"] or "-",
                f"{m['queued_requests']:,}",
                m["running_batches"],
                m["validating_batches"],
                _states(m["workers"]),
            )
            for m in stats["models"]
        ),
        empty="No model has work or workers.",
    )
    output.print_table(
        ["PROJECT", "BATCHES TODAY", "INPUT TOKENS", "OUTPUT TOKENS"],
        (
            (p["project"], p["batches"], f"{p['input_tokens']:,}", f"{p['output_tokens']:,}")
            for p in stats["tokens_today"]
        ),
        empty="No tokens today.",
    )
    return 0
