"""`overnight webhooks create|list|update|rm|rotate-secret|test|deliveries`.

They call `/v1/webhook_endpoints` with the SDK's `client.webhooks`, as code written for
OpenAI would.
"""

import argparse
from typing import Any

from app.client import output
from app.client.arguments import ALL_EVENTS
from app.client.connection import client


def _print_secret(endpoint: Any) -> None:
    output.errors.print(
        f"{endpoint.id}: its signing secret, shown once:", markup=False, soft_wrap=True
    )
    print(endpoint.signing_secret)


def _project(args: argparse.Namespace) -> dict[str, str] | None:
    return {"project": args.project} if args.project else None


def cmd_create(args: argparse.Namespace) -> int:
    endpoint = client(args).webhooks.create(
        name=args.name or args.url,
        url=args.url,
        event_types=args.events or ALL_EVENTS,
        extra_body=_project(args),
    )
    _print_secret(endpoint)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    endpoints = client(args).webhooks.list(limit=100, extra_query=_project(args)).data
    return output.print_listing(
        args.json,
        endpoints,
        ["ID", "NAME", "URL", "EVENTS", "ENABLED", "CREATED"],
        (
            (
                e.id,
                e.name,
                e.url,
                ",".join(e.event_types),
                "yes" if getattr(e, "enabled", True) else "no",
                output.age(e.created_at),
            )
            for e in endpoints
        ),
        empty="No webhook endpoints: add one with `overnight webhooks create URL`.",
    )


def cmd_update(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.url:
        changes["url"] = args.url
    if args.name:
        changes["name"] = args.name
    if args.events:
        changes["event_types"] = args.events
    extra = {"enabled": args.enabled == "yes"} if args.enabled else None
    endpoint = client(args).webhooks.update(args.endpoint_id, extra_body=extra, **changes)
    output.print_json(endpoint)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    api = client(args)
    for endpoint_id in args.endpoint_ids:
        print(f"{api.webhooks.delete(endpoint_id).id} deleted")
    return 0


def cmd_rotate_secret(args: argparse.Namespace) -> int:
    endpoint = client(args).webhooks.rotate_secret(
        args.endpoint_id, keep_old_secret_active_for_24_hours=args.keep_old
    )
    _print_secret(endpoint)
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    result = client(args).webhooks.test(args.endpoint_id, event_type=args.event)
    print(f"{result.event_type} sent to {result.webhook_endpoint_id}: HTTP {result.status_code}")
    return 0 if 200 <= result.status_code < 300 else 1


def cmd_deliveries(args: argparse.Namespace) -> int:
    page: dict[str, Any] = client(args).get(
        f"/webhook_endpoints/{args.endpoint_id}/deliveries",
        options={"params": {"limit": args.limit}},
        cast_to=dict,
    )
    rows = page["data"]
    return output.print_listing(
        args.json,
        rows,
        ["WEBHOOK-ID", "EVENT", "STATUS", "ATTEMPTS", "HTTP", "LATENCY", "LAST ERROR", "CREATED"],
        (
            (
                d["id"],
                d["event_type"],
                d["status"],
                d["attempts"],
                d["last_status_code"] or "",
                "" if d["latency_ms"] is None else f"{d['latency_ms']:.0f} ms",
                d["last_error"] or "",
                output.age(d["created_at"]),
            )
            for d in rows
        ),
        empty="No deliveries yet.",
    )
