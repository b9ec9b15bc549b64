"""`overnight batches submit|list|show|cancel|download|retry`.

Message Batches (Anthropic's API) are batches too: every command takes their `msgbatch_…`
ids, and `list` and `show` say which API a batch was created through.
"""

import argparse
import os
from itertools import islice
from pathlib import Path
from typing import Any, cast

import openai
import orjson
from openai.types import Batch

from app.client import output
from app.client.connection import CliError, client
from app.client.projects import schedule_of, schedule_rows
from app.client.wait import wait_for
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.ids import batch_api_of

DEFAULT_ENDPOINT = "/v1/chat/completions"


def sniff_endpoint(path: Path) -> str:
    """The `url` of the file's first request, so that `--endpoint` is rarely needed."""
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = orjson.loads(raw).get("url")
                except (orjson.JSONDecodeError, AttributeError):
                    return DEFAULT_ENDPOINT  # the server will report the bad line
                return url if isinstance(url, str) and url else DEFAULT_ENDPOINT
    raise CliError(f"{path} has no requests: it is empty.")


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise CliError(f"--metadata takes KEY=VALUE, not {pair!r}.")
        result[key] = value
    return result


def cmd_submit(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"no such file: {path}")
    endpoint = args.endpoint or sniff_endpoint(path)
    api = client(args)
    with path.open("rb") as f:
        uploaded = api.files.create(file=(path.name, f), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id,
        # Ours serves endpoints that the SDK's Literal does not list (/v1/messages, /v1/score…).
        endpoint=cast(Any, endpoint),
        completion_window=args.completion_window,
        metadata=_metadata(args.metadata),
    )
    output.errors.print(f"uploaded {path.name} as {uploaded.id}", markup=False)
    print(batch.id)
    if not args.wait:
        return 0
    followed = wait_for(api, batch.id, args.interval)
    batch = followed.batch
    _show(batch, waited=followed.waited)
    if batch.status == BatchStatus.FAILED:
        return 1
    _download(
        api,
        batch,
        args.output or f"{path.stem}.output.jsonl",
        args.errors_output or f"{path.stem}.errors.jsonl",
    )
    return 0 if batch.status == BatchStatus.COMPLETED else 1


def _listed(args: argparse.Namespace) -> list[Batch]:
    """The newest `--limit` batches, of `--status` only if given (paging on as needed)."""
    if not args.status:
        return client(args).batches.list(limit=args.limit).data
    pages = client(args).batches.list(limit=100)
    return list(islice((b for b in pages if b.status == args.status), args.limit))


def cmd_list(args: argparse.Namespace) -> int:
    batches = _listed(args)
    return output.print_listing(
        args.json,
        batches,
        ["ID", "API", "STATUS", "DONE", "FAILED", "TOTAL", "MODEL", "CREATED"],
        (
            (
                b.id,
                batch_api_of(b.id),
                b.status,
                b.request_counts.completed if b.request_counts else 0,
                b.request_counts.failed if b.request_counts else 0,
                b.request_counts.total if b.request_counts else 0,
                b.model or "",
                output.age(b.created_at),
            )
            for b in batches
        ),
        f"No {args.status} batches." if args.status else "No batches.",
    )


def _show(batch: Batch, schedule: dict[str, Any] | None = None, waited: float = 0.0) -> None:
    counts = batch.request_counts
    rows = [
        ("id", batch.id),
        ("api", batch_api_of(batch.id)),
        ("status", batch.status),
        ("endpoint", batch.endpoint),
        ("model", batch.model or ""),
        ("input file", batch.input_file_id),
        ("output file", batch.output_file_id or ""),
        ("error file", batch.error_file_id or ""),
    ]
    if counts:
        rows.append(
            (
                "requests",
                f"{output.outcomes(batch)}, {counts.total} total",
            )
        )
    if batch.usage:
        rows.append(("tokens", f"{batch.usage.input_tokens} in, {batch.usage.output_tokens} out"))
    if batch.in_progress_at is not None:
        rows.append(("throughput", output.throughput_text(batch, waited)))
    for field in (
        "created_at",
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "cancelling_at",
        "cancelled_at",
        "expired_at",
        "expires_at",
    ):
        if (ts := getattr(batch, field)) is not None:
            rows.append((field.removesuffix("_at").replace("_", " "), output.when(ts)))
    rows += schedule_rows(schedule)
    for key, value in (batch.metadata or {}).items():
        rows.append((f"metadata {key}", value))
    output.print_table(["FIELD", "VALUE"], [(k, v) for k, v in rows if v != ""], empty="")
    if batch.errors and batch.errors.data:
        output.print_table(
            ["LINE", "CODE", "MESSAGE"],
            (
                (e.line if e.line is not None else "", e.code or "", e.message or "")
                for e in batch.errors.data
            ),
            empty="",
        )


def cmd_show(args: argparse.Namespace) -> int:
    api = client(args)
    batch = api.batches.retrieve(args.batch_id)
    if args.json:
        output.print_json(batch)
    else:
        ended = batch.status in TERMINAL_BATCH_STATUSES
        _show(batch, None if ended else schedule_of(api, batch.id))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    batch = client(args).batches.cancel(args.batch_id)
    print(f"{batch.id} {batch.status}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    batch = client(args).post(
        f"/batches/{args.batch_id}/retry", body={"all": args.all}, cast_to=openai.types.Batch
    )
    counts = batch.request_counts
    total = f" ({counts.total} requests)" if counts and counts.total else ""
    print(f"{batch.id} {batch.status}{total}, retrying {args.batch_id}")
    return 0


def save_file(api: openai.OpenAI, file_id: str, target: str) -> None:
    """Streams a file to `target` through a temporary name: never a half-written result."""
    path = Path(target)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with api.files.with_streaming_response.content(file_id) as response:
            response.stream_to_file(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _download(api: openai.OpenAI, batch: Batch, out: str, err: str) -> None:
    saved = False
    for file_id, target, what in (
        (batch.output_file_id, out, "results"),
        (batch.error_file_id, err, "errors"),
    ):
        if file_id:
            save_file(api, file_id, target)
            output.errors.print(f"{what} saved to {target}", markup=False)
            saved = True
    if not saved:
        output.errors.print("the batch has no output or error file.", markup=False)


def cmd_download(args: argparse.Namespace) -> int:
    api = client(args)
    batch = api.batches.retrieve(args.batch_id)
    if batch.status not in TERMINAL_BATCH_STATUSES:
        raise CliError(
            f"{batch.id} is {batch.status}: its files exist once it has ended; try again later."
        )
    if batch.status == BatchStatus.FAILED:
        raise CliError(
            f"{batch.id} failed validation and has no results: "
            f"`overnight batches show {batch.id}` lists its errors."
        )
    _download(
        api,
        batch,
        args.output or f"{batch.id}.output.jsonl",
        args.errors_output or f"{batch.id}.errors.jsonl",
    )
    return 0
