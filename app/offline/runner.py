"""The run: a private deployment in the work directory, the service's pipeline, one file out."""

import argparse
import asyncio
import gc
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic_settings import SettingsConfigDict

from app.config import ServedModel, Settings, embedded_database_url, get_settings
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.db.session import engine_for, session_scope, upgrade
from app.endpoints import CHAT, SUPPORTED
from app.errors import OpenAIError
from app.logging import configure_logging
from app.offline.arguments import worker_only_options
from app.offline.delivery import deliver, write_results
from app.offline.errors import OfflineError
from app.offline.progress import batch_row, follow
from app.offline.source import INPUT_FILE_ID, is_url, store_input
from app.offline.state import State, input_version, is_same_run, load_state, save_state
from app.offline.takeover import take_over
from app.schemas.batches import BatchObject, CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.files import create_file_from_storage, file_storage_key
from app.services.jsonl import iter_lines
from app.services.media_urls import ANY_HOST
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import Storage, storage_for
from worker.models import is_bundled, source_of, unavailable

OWNER = "run-batch"
# vLLM's default (0) kills the engine's processes at exit, which leaks their semaphores and
# shared memory; a few seconds let them exit and clean up. A user's flag comes later and wins.
ENGINE_DEFAULTS = ["--shutdown-timeout", "10"]


@dataclass(frozen=True)
class FirstLine:
    """Where the first request goes and which model it names (validation checks every line)."""

    url: str
    model: str | None


def default_work_dir(source: str) -> Path:
    where = source if is_url(source) else str(Path(source).resolve())
    return Path(".overnight-run-batch") / hashlib.sha256(where.encode()).hexdigest()[:16]


def first_line(storage: Storage, key: str) -> FirstLine | None:
    """None when the file has no request at all."""
    for _line_no, raw in iter_lines(storage, key):
        try:
            data = orjson.loads(raw)
            body = data.get("body")
            model = body.get("model") if isinstance(body, dict) else None
            return FirstLine(str(data.get("url")), model if isinstance(model, str) else None)
        except (orjson.JSONDecodeError, AttributeError):
            return FirstLine(CHAT, None)  # validation reports the line
    return None


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def served_model(model: str | None, first: FirstLine, engine_argv: list[str]) -> ServedModel:
    """The one model of the run, named as vLLM names it: `--served-model-name`, else
    `--model`, else (ours) the input's first model. A bundled model's name is the bundle."""
    loaded = model or first.model or "model"
    name = _flag(engine_argv, "--served-model-name") or loaded
    return ServedModel(name=name, endpoints=list(SUPPORTED), source=source_of(loaded))


class _PrivateSettings(Settings):
    # The run's settings are all given here: a `.env` file in the working directory is not its.
    model_config = SettingsConfigDict(env_file=None)


def offline_settings(work_dir: Path, served: ServedModel) -> Settings:
    """A private deployment: no limits a single file could hit, one served model.

    Its media URLs are fetched as vLLM's `run_batch` fetches them, from any host: the file is
    the operator's own (no tenant), run by the operator's command. vLLM's
    `--allowed-media-domains` narrows that, as for vLLM's runner.
    """
    return _PrivateSettings(
        data_dir=work_dir,
        database_url=None,
        storage_url=None,  # the work directory, whatever the environment says
        admin_key=None,
        max_file_bytes=1 << 50,
        max_batch_file_bytes=1 << 50,
        max_batch_requests=1 << 40,
        models=[served],
        allowed_media_domains=[ANY_HOST],
        media_allow_private=True,
    )


def _share_converted_models(work_dir: Path) -> None:
    """Bundled models are converted into the data directory's `models/`, once for every run,
    not into each work directory (removed after success)."""
    shared = get_settings().data_dir.resolve() / "models"
    shared.mkdir(parents=True, exist_ok=True)
    link = work_dir / "models"
    if not link.is_symlink():
        link.symlink_to(shared, target_is_directory=True)


def _start_clean(work_dir: Path) -> Storage:
    """No state, or another run's: nothing was created, or a run died before recording it."""
    _release(work_dir)
    for leftover in work_dir.glob("overnight.db*"):
        leftover.unlink()
    storage = storage_for(str(work_dir / "storage"))
    if (work_dir / "storage").is_dir():
        for key in list(storage.list("")):
            storage.delete(key)
    return storage


def start(
    work_dir: Path, source: str, model: str | None, engine_argv: list[str]
) -> tuple[Settings, State] | None:
    """Stores the input once, creates the batch once; later runs reuse both.

    None: the input has no request (vLLM's run_batch writes an empty output then).
    """
    storage = storage_for(str(work_dir / "storage"))
    state = load_state(work_dir, source)
    if state is not None and is_same_run(state, source, model):
        first = first_line(storage, file_storage_key(state.file_id))
        assert first is not None, "a recorded run has requests"
        return offline_settings(work_dir, served_model(model, first, engine_argv)), state
    if state is not None:
        print(
            f"overnight: {source} or --model changed since the run kept in {work_dir}: "
            "starting over",
            file=sys.stderr,
        )
    version = input_version(source)  # before reading: an edit while it is read is seen
    storage = _start_clean(work_dir)
    key, stored = store_input(storage, source)
    first = first_line(storage, key)
    if first is None:
        return None
    settings = offline_settings(work_dir, served_model(model, first, engine_argv))
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        create_file_from_storage(
            session,
            project_id=project_id,
            filename=Path(source.rstrip("/")).name or "input.jsonl",
            purpose="batch",
            stored=stored,
            expires_at=None,
            file_id=INPUT_FILE_ID,
        )
    # The batch's endpoint is nominal here: each line is run at its own url.
    endpoint = first.url if first.url in SUPPORTED else CHAT
    params = CreateBatchRequest(
        input_file_id=INPUT_FILE_ID,
        endpoint=endpoint,
        completion_window="24h",
    )
    with session_scope(settings) as session:
        try:
            batch = batches.create_batch(session, settings, project_id, params)
        except OpenAIError as exc:
            raise OfflineError(exc.message) from None
    state = State(
        input=source,
        file_id=INPUT_FILE_ID,
        batch_id=batch.id,
        input_version=version,
        model=model,
    )
    save_state(work_dir, state)
    return settings, state


async def _run_worker(
    settings: Settings, batch_id: str, args: argparse.Namespace
) -> BaseException | None:
    """The worker loop on the engine until the batch ends or a signal; what stopped the worker
    otherwise (its engine died)."""
    from worker.engine import start_engine
    from worker.loop import Worker, WorkerOptions, install_signal_handlers

    stop = asyncio.Event()
    install_signal_handlers(stop)
    async with start_engine(args) as engine:
        progress = asyncio.create_task(follow(settings, batch_id, stop))
        worker = Worker(settings, engine, WorkerOptions(worker_id=OWNER))
        await worker.run(stop)
        stop.set()  # the progress bar ends with the worker, whatever ended it
        await progress
    return worker.failure


def run_engine(settings: Settings, batch_id: str, engine_argv: list[str]) -> BaseException | None:
    """Starts vLLM and the worker loop until the batch has ended, then stops vLLM; returns
    what stopped the worker before, if anything did."""
    from worker import process
    from worker.cli import parse

    process.install()  # as the worker's: vLLM's engine processes die with this one
    # Parsed here, not in the coroutine: a frame of the parse outlives it (held inside vLLM)
    # and with it its caller's frame; were that the coroutine holding the engine, vLLM's
    # AsyncLLM would live until interpreter exit, where its __del__ raises a TypeError.
    args, settings = parse(engine_argv, settings)
    failure = asyncio.run(_run_worker(settings, batch_id, args))
    gc.collect()
    return failure


class Interrupted(Exception):
    """The run stopped before the batch ended (a signal): rerun to resume."""

    exit_code = 130


class EngineStopped(Interrupted):
    """The engine died under the run (a crash, the kernel's out-of-memory killer)."""

    exit_code = 1


def run(settings: Settings, state: State, engine_argv: list[str]) -> BatchObject:
    """Validates, runs and finalizes the batch (whatever of it is left)."""
    take_over(settings, state.batch_id)
    validate_pending(settings, OWNER, per_line=True)
    failure = None
    if batch_row(settings, state.batch_id).status == BatchStatus.IN_PROGRESS:
        try:
            failure = run_engine(settings, state.batch_id, engine_argv)
        except Exception as exc:
            if (reason := unavailable(exc, settings.models[0].source)) is None:
                raise
            raise OfflineError(str(reason)) from None
    # The worker finalizes when it finishes a shard; this covers a batch already done.
    finalize_ready_batches(settings, OWNER)
    batch = batch_row(settings, state.batch_id)
    if failure is not None and batch.status not in TERMINAL_BATCH_STATUSES:
        counts = batch.request_counts
        raise EngineStopped(
            f"error: the engine stopped ({failure}) with {counts.completed + counts.failed} "
            f"of {counts.total} requests done, which are kept"
        )
    return batch


def _report_failure(batch: BatchObject) -> str:
    lines = [f"the input is not a batch file ({batch.id}):"]
    for error in batch.errors.data if batch.errors else []:
        where = f"line {error.line}: " if error.line is not None else ""
        lines.append(f"  {where}{error.message} [{error.code}]")
    return "\n".join(lines)


def _run_file(args: argparse.Namespace, engine_argv: list[str], work_dir: Path) -> str:
    """Runs the file and writes its results; returns the summary line."""
    started = time.monotonic()
    begun = start(work_dir, args.input_file, args.model, engine_argv)
    if begun is None:
        deliver([], args.output_file)
        if args.error_file:
            deliver([], args.error_file)
        if not args.keep_work_dir:
            _remove_work_dir(work_dir)
        return f"the input has no requests -> empty {args.output_file}"
    settings, state = begun
    if is_bundled(settings.models[0].source):
        _share_converted_models(work_dir)
    argv = ["--model", settings.models[0].name, *ENGINE_DEFAULTS, *engine_argv]
    upgrade(settings.sqlalchemy_url)
    batch = run(settings, state, argv)
    if batch.status == BatchStatus.FAILED:
        raise OfflineError(_report_failure(batch))
    if batch.status not in TERMINAL_BATCH_STATUSES:
        raise Interrupted(f"stopped with {batch.status} {batch.id}")
    write_results(settings, batch, args.output_file, args.error_file, args.output_format)
    counts = batch.request_counts
    summary = (
        f"{batch.status}: {counts.completed} succeeded, {counts.failed} failed "
        f"of {counts.total} in {time.monotonic() - started:.0f} s -> {args.output_file}"
        + (f" (errors: {args.error_file})" if args.error_file else "")
    )
    if batch.status != BatchStatus.COMPLETED:
        raise OfflineError(summary)
    if not args.keep_work_dir:
        _remove_work_dir(work_dir)
    return summary


def _remove_work_dir(work_dir: Path) -> None:
    """After success: nothing is left to resume."""
    _release(work_dir)
    shutil.rmtree(work_dir, ignore_errors=True)


def _release(work_dir: Path) -> None:
    """Cached handles on the work directory's database and store go before their files."""
    engine_for(embedded_database_url(work_dir)).dispose()
    storage_for.cache_clear()


def _configure_logging() -> None:
    """overnight's own log lines only when OVERNIGHT_LOG_LEVEL asks for them: by default the
    progress bar is the report, beside vLLM's lines, as with vLLM's runner."""
    if level := os.environ.get("OVERNIGHT_LOG_LEVEL"):
        configure_logging(level, os.environ.get("OVERNIGHT_LOG_FORMAT", "auto"))


def main(args: argparse.Namespace, engine_argv: list[str]) -> int:
    """`overnight run-batch`; returns the exit code."""
    from worker import python_gc

    if refused := worker_only_options(engine_argv):
        print(
            f"overnight run-batch: error: {', '.join(refused)}: options of `overnight worker`, "
            "not of run-batch (its database, store and checkpoints are in --work-dir)",
            file=sys.stderr,
        )
        return 2
    python_gc.tune()
    _configure_logging()
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir(args.input_file)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        summary = _run_file(args, engine_argv, work_dir)
    except Interrupted as stopped:
        print(
            f"overnight: {stopped}; run the same command again to resume from {work_dir}",
            file=sys.stderr,
        )
        return stopped.exit_code
    except (OfflineError, OSError) as exc:
        print(f"overnight: error: {exc}", file=sys.stderr)
        return 1
    print(f"overnight: {summary}", file=sys.stderr)
    return 0
