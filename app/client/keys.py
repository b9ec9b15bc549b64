"""`overnight keys create|list|revoke`.

With a base URL (`--base-url` or `$OPENAI_BASE_URL`) they call the admin API, so they
work against a remote deployment with an admin key. Without one they write to this
machine's database directly (the first admin key has to come from somewhere).
"""

import argparse
import sys
from pathlib import Path
from typing import Any

from app.client import output
from app.client.connection import client, explicit_base_url
from app.config import get_settings
from app.db.session import session_scope, upgrade
from app.services import keys
from app.services.auth import DEFAULT_PROJECT


def _local_settings(args: argparse.Namespace) -> Any:
    settings = get_settings()
    if getattr(args, "data_dir", None):
        settings = settings.model_copy(update={"data_dir": Path(args.data_dir)})
    upgrade(settings.sqlalchemy_url)
    return settings


def cmd_create(args: argparse.Namespace) -> int:
    args.project = args.project or DEFAULT_PROJECT
    body = {"project": args.project, "role": args.role, "name": args.name or ""}
    if explicit_base_url(args):
        created: dict[str, Any] = client(args).post("/admin/api_keys", body=body, cast_to=dict)
        key_id, role, secret = created["id"], created["role"], created["value"]
    else:
        with session_scope(_local_settings(args)) as session:
            key, _project, secret = keys.create_project_key(
                session, args.project, args.role, args.name or ""
            )
            key_id, role = key.id, key.role
    output.errors.print(f"created {key_id} ({role}) for project {args.project!r}", markup=False)
    if args.project != DEFAULT_PROJECT:
        output.errors.print(
            f"note: it sees only {args.project!r}; what was made without keys is in project "
            f"{DEFAULT_PROJECT!r} (`overnight keys create --project {DEFAULT_PROJECT}` "
            "makes a key for it)",
            markup=False,
            soft_wrap=True,
        )
    print(secret)
    return 0


def _rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    if explicit_base_url(args):
        query = {"project": args.project} if args.project else {}
        page: dict[str, Any] = client(args).get(
            "/admin/api_keys", options={"params": query}, cast_to=dict
        )
        return list(page["data"])
    with session_scope(_local_settings(args)) as session:
        return [key.model_dump() for key in keys.key_objects(session, args.project)]


def cmd_list(args: argparse.Namespace) -> int:
    rows = _rows(args)
    return output.print_listing(
        args.json,
        rows,
        ["ID", "PROJECT", "ROLE", "NAME", "KEY", "CREATED"],
        (
            (
                r["id"],
                r["project_name"],
                r["role"],
                r["name"],
                r["redacted_value"],
                output.age(r["created_at"]),
            )
            for r in rows
        ),
        empty="No API keys: the API is open to anyone who can reach it.",
    )


def cmd_revoke(args: argparse.Namespace) -> int:
    if explicit_base_url(args):
        client(args).delete(f"/admin/api_keys/{args.key_id}", cast_to=dict)
    else:
        settings = _local_settings(args)
        with session_scope(settings) as session:
            keys.revoke_key(session, args.key_id, admin_key_configured=bool(settings.admin_key))
    print(
        f"{args.key_id} revoked: requests with it now get 401 (an API process that did not "
        "revoke it may let it in for up to its OVERNIGHT_AUTH_CACHE_SECONDS, 5 by default). "
        "A running API that required keys still does.",
        file=sys.stdout,
    )
    return 0
