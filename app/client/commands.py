"""The people's subcommands, added to the `overnight` parser.

Each command's module is named, not imported (`Deferred`): building this parser for `--help`
must not import the SDK.
"""

import argparse
from typing import Any

from app.client.arguments import (
    ALL_EVENTS,
    QUOTAS,
    Deferred,
    add_connection_args,
    limit_value,
    quota_option,
)
from app.core.states import BatchStatus


def _command(
    group: Any, name: str, func: str, help_text: str, *, json: bool = False
) -> argparse.ArgumentParser:
    """`func`: `module.function` in `app.client`, e.g. `batches.cmd_submit`."""
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, description=help_text)
    add_connection_args(parser)
    if json:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=Deferred(*func.split(".")))
    return parser


def _batches(sub: Any) -> None:
    group = sub.add_parser("batches", help="submit and follow batches").add_subparsers(
        dest="batches_command", required=True
    )
    p = _command(group, "submit", "batches.cmd_submit", "upload a JSONL file and create a batch")
    p.add_argument("file", help="the requests, one JSON object a line")
    p.add_argument(
        "--endpoint", help="e.g. /v1/embeddings (default: the `url` of the file's first line)"
    )
    p.add_argument("--completion-window", default="24h")
    p.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--wait", action="store_true", help="follow it to the end, then download")
    p.add_argument("-o", "--output", help="results file (default: FILE's name + .output.jsonl)")
    p.add_argument("--errors-output", help="errors file (default: FILE's name + .errors.jsonl)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls")

    p = _command(group, "list", "batches.cmd_list", "the newest batches", json=True)
    p.add_argument("--limit", type=int, default=20, help="how many (default: 20)")
    p.add_argument(
        "--status", choices=[s.value for s in BatchStatus], help="only batches in this status"
    )
    for name, func, text in (
        ("show", "batches.cmd_show", "one batch: status, counts, timeline, errors"),
        ("cancel", "batches.cmd_cancel", "cancel a batch"),
        ("download", "batches.cmd_download", "save a finished batch's output and error files"),
    ):
        p = _command(group, name, func, text, json=name == "show")
        p.add_argument("batch_id")
        if name == "download":
            p.add_argument("-o", "--output", help="default: BATCH_ID.output.jsonl")
            p.add_argument("--errors-output", help="default: BATCH_ID.errors.jsonl")
    p = _command(
        group, "retry", "batches.cmd_retry", "a new batch of a finished batch's retryable failures"
    )
    p.add_argument("batch_id")
    p.add_argument(
        "--all", action="store_true", help="also requests the engine refused (4xx), not only 5xx"
    )


def _files(sub: Any) -> None:
    group = sub.add_parser("files", help="uploaded and result files").add_subparsers(
        dest="files_command", required=True
    )
    p = _command(group, "list", "files.cmd_list", "the newest files", json=True)
    p.add_argument("--purpose", help="e.g. batch, batch_output")
    p.add_argument("--limit", type=int, default=100, help="how many (default: 100)")
    p = _command(group, "rm", "files.cmd_rm", "delete files")
    p.add_argument("file_ids", nargs="+", metavar="FILE_ID")


def _keys(sub: Any) -> None:
    group = sub.add_parser(
        "keys",
        help="API keys (over HTTP with --base-url/$OPENAI_BASE_URL, else this machine's database)",
    ).add_subparsers(dest="keys_command", required=True)
    p = _command(group, "create", "keys.cmd_create", "create a key for a project and print it")
    p.add_argument(
        "--project",
        help="the project whose files and batches the key sees (default: the project where "
        "everything made without keys lives)",
    )
    p.add_argument("--role", choices=["member", "admin"], default="member")
    p.add_argument("--name")
    p.add_argument("--data-dir", dest="data_dir", help="local mode: the deployment's data dir")
    p = _command(group, "list", "keys.cmd_list", "keys that are not revoked", json=True)
    p.add_argument("--project", help="only this project's keys")
    p.add_argument("--data-dir", dest="data_dir", help="local mode: the deployment's data dir")
    p = _command(group, "revoke", "keys.cmd_revoke", "revoke a key at once")
    p.add_argument("key_id")
    p.add_argument("--data-dir", dest="data_dir", help="local mode: the deployment's data dir")


def _projects(sub: Any) -> None:
    group = sub.add_parser(
        "projects", help="projects: fair-share weights, enqueued limits, quotas (admin key)"
    ).add_subparsers(dest="projects_command", required=True)
    _command(group, "list", "projects.cmd_list", "every project with its weight", json=True)
    p = _command(group, "weight", "projects.cmd_weight", "set a project's fair-share weight")
    p.add_argument("project", help="the project's name or id")
    p.add_argument("weight", type=float, help="its share against other projects (default 1)")
    p = _command(
        group, "limits", "projects.cmd_limits", "a project's enqueued limits per model", json=True
    )
    p.add_argument("project", help="the project's name or id")
    p = _command(
        group, "limit", "projects.cmd_limit", "set a project's own enqueued limits on a model"
    )
    p.add_argument("project", help="the project's name or id")
    p.add_argument("model")
    for option, what in (("tokens", "estimated prompt tokens"), ("requests", "requests")):
        p.add_argument(
            f"--{option}",
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=f"{what} its unfinished batches may hold; `default`: the deployment's",
        )
    p = _command(
        group, "quotas", "projects.cmd_quotas", "a project's quotas and what it holds", json=True
    )
    p.add_argument("project", help="the project's name or id")
    p = _command(group, "quota", "projects.cmd_quota", "set a project's own quotas")
    p.add_argument("project", help="the project's name or id")
    for field, unit in QUOTAS:
        p.add_argument(
            quota_option(field),
            dest=field,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=f"the most {unit} it may hold; `default`: the deployment's",
        )


def _webhooks(sub: Any) -> None:
    group = sub.add_parser(
        "webhooks", help="endpoints that get a signed event when a batch ends"
    ).add_subparsers(dest="webhooks_command", required=True)
    events: dict[str, Any] = {"nargs": "+", "choices": ALL_EVENTS, "metavar": "EVENT"}
    p = _command(group, "create", "webhooks.cmd_create", "add an endpoint; prints its secret once")
    p.add_argument("url", help="http(s) URL of the receiver")
    p.add_argument("--name", help="default: the URL")
    p.add_argument("--events", **events, help="default: all four batch.* events")
    p.add_argument("--project", help="create it for this project (by name; an admin key only)")
    p = _command(group, "list", "webhooks.cmd_list", "this project's endpoints", json=True)
    p.add_argument(
        "--project", help="only this project's (by name); an admin key lists every project's"
    )
    p = _command(group, "update", "webhooks.cmd_update", "change an endpoint's URL, events, state")
    p.add_argument("endpoint_id")
    p.add_argument("--url")
    p.add_argument("--name")
    p.add_argument("--events", **events)
    p.add_argument("--enabled", choices=["yes", "no"])
    p = _command(group, "rm", "webhooks.cmd_rm", "delete endpoints")
    p.add_argument("endpoint_ids", nargs="+", metavar="ENDPOINT_ID")
    p = _command(group, "rotate-secret", "webhooks.cmd_rotate_secret", "new signing secret")
    p.add_argument("endpoint_id")
    p.add_argument("--keep-old", action="store_true", help="sign with both for 24 hours")
    p = _command(group, "test", "webhooks.cmd_test", "send a sample event now")
    p.add_argument("endpoint_id")
    p.add_argument("--event", choices=ALL_EVENTS, default="batch.completed")
    p = _command(group, "deliveries", "webhooks.cmd_deliveries", "recent deliveries", json=True)
    p.add_argument("endpoint_id")
    p.add_argument("--limit", type=int, default=20)


def register(sub: Any) -> None:
    """Adds `batches`, `files`, `keys`, `projects`, `webhooks` and `status` to the `overnight`
    subparsers."""
    _batches(sub)
    _files(sub)
    _keys(sub)
    _projects(sub)
    _webhooks(sub)
    _command(
        sub, "status", "status.cmd_status", "the deployment at a glance (admin key)", json=True
    )
