"""`overnight run-batch`: one batch file through the worker pipeline, with no server.

A drop-in for vLLM's `run_batch` (`-i/--input-file`, `-o/--output-file`, any engine
argument), run as a private deployment in a work directory: a SQLite database and a
store. The input is validated, sharded, run and finalized exactly as the service does,
so the output lines are the service's. Everything is checkpointed there: rerun the same
command after a crash and it resumes where the results stop.
"""

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select, update

from app.config import CPU_KV_CACHE_GIB, ServedModel, Settings
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus, ShardStatus
from app.db.models import Batch, File, Shard
from app.db.session import session_scope, upgrade
from app.endpoints import SUPPORTED
from app.errors import OpenAIError
from app.schemas.batches import BatchObject, CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.files import create_file_from_storage, file_storage_key
from app.services.validation import validate_pending
from app.storage import Storage, storage_for, storage_of
from app.storage.base import READ_CHUNK, put
from worker.finalizer import finalize_ready_batches
from worker.models import source_of, unavailable

STATE_FILE = "run-batch.json"
OWNER = "run-batch"
POLL_SECONDS = 0.5


class OfflineError(Exception):
    """Ends the run with a message and exit code 1."""


class State(BaseModel):
    """What the work directory remembers between runs of the same command."""

    input: str
    file_id: str
    batch_id: str


@dataclass
class Request:
    """The first request of the input: where it goes and which model it names."""

    url: str
    model: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input-file", required=True, help="a path or an http(s) URL")
    parser.add_argument(
        "-o", "--output-file", required=True, help="a path, or an http(s) URL to PUT to"
    )
    parser.add_argument(
        "--error-file",
        help="failed requests go here (path or URL) instead of into the output file",
    )
    parser.add_argument(
        "--work-dir",
        help="database, store and checkpoints; rerun with the same one to resume "
        "(default: .overnight-run-batch/<hash of the input> in the current directory)",
    )
    parser.add_argument(
        "--model",
        help="what vLLM loads (a Hugging Face id, a folder, bundled:smollm2); "
        "default: the bundled model of that name, else the input's `model`",
    )


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def default_work_dir(source: str) -> Path:
    where = source if is_url(source) else str(Path(source).resolve())
    return Path(".overnight-run-batch") / hashlib.sha256(where.encode()).hexdigest()[:16]


def offline_settings(work_dir: Path, request: Request, model: str | None) -> Settings:
    """A private deployment: no limits a single file could hit, one served model."""
    source = source_of(model or request.model)
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=work_dir,
        database_url=None,
        storage_url=None,  # the work directory, whatever the environment says
        admin_key=None,
        max_file_bytes=1 << 50,
        max_batch_file_bytes=1 << 50,
        max_batch_requests=1 << 40,
        models=[ServedModel(name=request.model, endpoints=list(SUPPORTED), source=source)],
    )


# --- input -------------------------------------------------------------------------------


def _read_source(source: str) -> Iterator[bytes]:
    if is_url(source):
        with httpx.stream("GET", source, follow_redirects=True, timeout=60) as response:
            if response.status_code >= 400:
                raise OfflineError(f"GET {source} answered {response.status_code}")
            yield from response.iter_bytes(READ_CHUNK)
        return
    try:
        f = open(source, "rb")  # noqa: SIM115 - closed below, read lazily
    except OSError as exc:
        raise OfflineError(f"cannot read {source}: {exc.strerror or exc}") from None
    with f:
        while chunk := f.read(READ_CHUNK):
            yield chunk


def first_request(storage: Storage, key: str) -> Request:
    """The url and model of the first non-blank line (validation checks every line)."""
    from app.services.jsonl import iter_lines

    for line_no, raw in iter_lines(storage, key):
        try:
            data = orjson.loads(raw)
            return Request(str(data["url"]), str(data["body"]["model"]))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise OfflineError(
                f"line {line_no} of the input is not a batch request "
                f'({{"custom_id", "method", "url", "body": {{"model", …}}}}): {exc!r}'
            ) from None
    raise OfflineError("the input file has no requests")


def _store_input(staging: Storage, source: str) -> tuple[str, Any]:
    key = file_storage_key("file-offline-input")
    try:
        return key, put(staging, key, _read_source(source))
    except httpx.HTTPError as exc:
        raise OfflineError(f"cannot GET {source}: {exc}") from None


def start(work_dir: Path, source: str, model: str | None) -> tuple[Settings, State]:
    """Stores the input once, creates the batch once; later runs reuse both."""
    state_path = work_dir / STATE_FILE
    if state_path.exists():
        state = State.model_validate_json(state_path.read_bytes())
        if state.input != source:
            raise OfflineError(
                f"{work_dir} holds the run of {state.input}, not {source}: use another --work-dir"
            )
        storage = storage_for(str(work_dir / "storage"))
        request = first_request(storage, file_storage_key(state.file_id))
        return offline_settings(work_dir, request, model), state
    # No state: nothing was created, or a run died before recording it. Start clean.
    for leftover in work_dir.glob("overnight.db*"):
        leftover.unlink()
    staging = storage_for(str(work_dir / "storage"))
    for key in list(staging.list("")):
        staging.delete(key)
    key, stored = _store_input(staging, source)
    request = first_request(staging, key)
    settings = offline_settings(work_dir, request, model)
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        row = create_file_from_storage(
            session,
            project_id=project_id,
            filename=Path(source.rstrip("/")).name or "input.jsonl",
            purpose="batch",
            stored=stored,
            expires_at=None,
            file_id="file-offline-input",
        )
        file_id = row.id
    params = CreateBatchRequest(
        input_file_id=file_id, endpoint=request.url, completion_window="24h"
    )
    with session_scope(settings) as session:
        batch = _create(session, settings, project_id, params)
    state = State(input=source, file_id=file_id, batch_id=batch.id)
    state_path.write_text(state.model_dump_json())
    return settings, state


def _create(session: Any, settings: Settings, project_id: str, params: Any) -> BatchObject:
    try:
        return batches.create_batch(session, settings, project_id, params)
    except OpenAIError as exc:
        raise OfflineError(exc.message) from None


def take_over(settings: Settings, batch_id: str) -> None:
    """Leases of a previous run of this command are stale by definition: expire them now."""
    with session_scope(settings) as session:
        session.execute(
            update(Shard)
            .where(Shard.batch_id == batch_id, Shard.status == ShardStatus.RUNNING)
            .values(heartbeat_at=0.0)
        )
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.lease_owner.is_not(None))
            .values(heartbeat_at=0.0)
        )


# --- running -----------------------------------------------------------------------------


def batch_row(settings: Settings, batch_id: str) -> BatchObject:
    with session_scope(settings) as session:
        project_id = session.scalars(select(Batch.project_id).where(Batch.id == batch_id)).one()
        return batches.get_batch(session, project_id, batch_id)


async def _follow(settings: Settings, batch_id: str, stop: asyncio.Event) -> None:
    """Shows progress; stops the worker once the batch has ended."""
    columns = (
        TextColumn("{task.fields[status]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("run-batch", total=None, status="", counts="")
        while True:
            batch = await asyncio.to_thread(batch_row, settings, batch_id)
            counts = batch.request_counts
            bar.update(
                task,
                total=counts.total or None,
                completed=counts.completed + counts.failed,
                status=batch.status,
                counts=f"{counts.completed} ok, {counts.failed} failed, "
                f"{batch.usage.output_tokens} tokens out",
            )
            if batch.status in TERMINAL_BATCH_STATUSES:
                stop.set()
                return
            if stop.is_set():
                return
            await asyncio.sleep(POLL_SECONDS)


async def _run_worker(settings: Settings, batch_id: str, engine_argv: list[str]) -> None:
    from worker.cli import parse
    from worker.engine import start_engine
    from worker.loop import Worker, WorkerOptions, install_signal_handlers

    args, settings = parse(engine_argv, settings)
    stop = asyncio.Event()
    install_signal_handlers(stop)
    async with start_engine(args) as engine:
        follow = asyncio.create_task(_follow(settings, batch_id, stop))
        await Worker(settings, engine, WorkerOptions(worker_id=OWNER)).run(stop)
        await follow


def run(settings: Settings, state: State, engine_argv: list[str]) -> BatchObject:
    """Validates, runs and finalizes the batch (whatever of it is left)."""
    take_over(settings, state.batch_id)
    validate_pending(settings, OWNER)
    if batch_row(settings, state.batch_id).status == BatchStatus.IN_PROGRESS:
        try:
            asyncio.run(_run_worker(settings, state.batch_id, engine_argv))
        except Exception as exc:
            if (reason := unavailable(exc, settings.models[0].source)) is None:
                raise
            raise OfflineError(str(reason)) from None
    # The worker finalizes when it finishes a shard; this covers a batch already done.
    finalize_ready_batches(settings, OWNER)
    return batch_row(settings, state.batch_id)


# --- output ------------------------------------------------------------------------------


def _file_chunks(settings: Settings, file_ids: Sequence[str | None]) -> Iterator[bytes]:
    storage = storage_of(settings)
    for file_id in file_ids:
        if file_id is None:
            continue
        with session_scope(settings) as session:
            key = session.scalars(select(File.storage_key).where(File.id == file_id)).one()
        yield from storage.read(key)


def deliver(chunks: Iterator[bytes], target: str) -> None:
    """Writes a whole file or nothing: temp + rename locally, one PUT for a URL."""
    if is_url(target):
        try:
            response = httpx.put(target, content=chunks, timeout=300)
        except httpx.HTTPError as exc:
            raise OfflineError(f"cannot PUT {target}: {exc}") from None
        if response.status_code >= 400:
            raise OfflineError(f"PUT {target} answered {response.status_code}")
        return
    path = Path(target)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=".run-batch-")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(settings: Settings, batch: BatchObject, output: str, errors: str | None) -> None:
    if errors is None:
        # vLLM's run_batch has one output file with every line.
        deliver(_file_chunks(settings, [batch.output_file_id, batch.error_file_id]), output)
        return
    deliver(_file_chunks(settings, [batch.output_file_id]), output)
    deliver(_file_chunks(settings, [batch.error_file_id]), errors)


def _report_failure(batch: BatchObject) -> str:
    lines = [f"the input failed validation ({batch.id}):"]
    for error in batch.errors.data if batch.errors else []:
        where = f"line {error.line}: " if error.line is not None else ""
        lines.append(f"  {where}{error.message} [{error.code}]")
    return "\n".join(lines)


def main(args: argparse.Namespace, engine_argv: list[str]) -> int:
    """`overnight run-batch`; returns the exit code."""
    # As under `serve`: a fixed KV cache, not 92% of the machine's memory (CPU engines).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    started = time.monotonic()
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir(args.input_file)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        settings, state = start(work_dir, args.input_file, args.model)
        served = settings.models[0]
        argv = ["--model", served.name, *engine_argv]
        upgrade(settings.sqlalchemy_url)
        batch = run(settings, state, argv)
        if batch.status not in TERMINAL_BATCH_STATUSES:
            print(
                f"overnight: stopped with {batch.status} {batch.id}; run the same command "
                f"again to resume from {work_dir}",
                file=sys.stderr,
            )
            return 130
        if batch.status == BatchStatus.FAILED:
            raise OfflineError(_report_failure(batch))
        write_results(settings, batch, args.output_file, args.error_file)
    except (OfflineError, OSError) as exc:
        print(f"overnight: error: {exc}", file=sys.stderr)
        return 1
    counts = batch.request_counts
    print(
        f"overnight: {batch.status}: {counts.completed} succeeded, {counts.failed} failed "
        f"of {counts.total} in {time.monotonic() - started:.0f} s -> {args.output_file}"
        + (f" (errors: {args.error_file})" if args.error_file else ""),
        file=sys.stderr,
    )
    return 0 if batch.status == BatchStatus.COMPLETED else 1
