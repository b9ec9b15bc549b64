"""`overnight worker [MODEL] [options]`: the model first, as `vllm serve MODEL` takes it.

overnight's own options are parsed here, without importing vLLM (so `--help` is quick);
every other argument goes to vLLM's own parser (`FlexibleArgumentParser` with
`AsyncEngineArgs.add_cli_args` and the OpenAI frontend's arguments).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.cli_switching import add_switching_arguments, serve_models, switching_args
from worker.dtype import worker_dtype
from worker.kv_cache import reserve_cpu_kv_cache
from worker.models import (
    BUNDLED_NAMES,
    ModelNotFoundError,
    is_bundled,
    resolve,
    source_of,
    stay_offline_for,
    unavailable,
)

if TYPE_CHECKING:
    from app.config import Settings
    from worker.backoff import BackoffPolicy

DEFAULT_MODEL = "bundled:smollm2"
BUSY_WINDOW_DIVISOR = 8
# On CPU every running sequence lengthens the engine step an online request waits for
# (bench/bench_online.py: busy window 8, 4, 2 gave 2.0x, 1.8x, 1.7x the TTFT p99 of online
# traffic alone), so there the batch keeps only this many in flight beside online requests.
CPU_BUSY_WINDOW = 4
log = logging.getLogger("overnight.worker")

VLLM_HELP = (
    "Every vLLM engine argument is accepted too (--tensor-parallel-size, --max-model-len, "
    "--dtype, ...): `overnight worker --help=all` lists them, --help=<group> shows one "
    "group (e.g. --help=ModelConfig), --help=<word> searches them."
)


def own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="overnight worker",
        usage="overnight worker [MODEL] [options] [vLLM engine arguments]",
        description="Run batch requests on an embedded vLLM engine.",
        epilog=VLLM_HELP,
        allow_abbrev=False,  # a prefix of one of vLLM's flags must reach vLLM
    )
    bundled = ", ".join(BUNDLED_NAMES)
    parser.add_argument(
        "--model",
        help="what to serve (or give it first, without --model): a model of OVERNIGHT_MODELS, "
        f"a bundled model ({bundled}), a local folder or a Hugging Face id, downloaded into "
        "the Hugging Face cache; default: SmolLM2-135M-Instruct",
    )
    parser.add_argument("--data-dir", help="the deployment's data directory (OVERNIGHT_DATA_DIR)")
    parser.add_argument("--worker-id", help="a stable name for this worker (default: host:pid)")
    parser.add_argument(
        "--window",
        type=int,
        help="requests kept in flight in the engine (default: 2 x --max-num-seqs)",
    )
    parser.add_argument(
        "--no-dedup",
        dest="dedup",
        action="store_false",
        help="run every request, even an identical deterministic one (default: each runs once)",
    )
    parser.add_argument(
        "--no-prefix-grouping",
        dest="prefix_grouping",
        action="store_false",
        help="submit requests in input order (default: grouped by shared prompt prefix)",
    )
    parser.add_argument(
        "--lora-dir",
        help="serve each sub-folder of this folder holding a LoRA adapter of the model "
        "(adapter_config.json) under the folder's name, loaded when a line first names it; "
        "implies --enable-lora",
    )
    parser.add_argument(
        "--lora-repo",
        action="append",
        metavar="ORG/NAME",
        help="serve the LoRA adapters of this Hugging Face repo (repeatable): the repo as "
        "ORG/NAME if it holds adapter_config.json at its root, each folder holding one as "
        "ORG/NAME/SUB; listed at start and every five minutes, downloaded into the Hugging "
        "Face cache when a line first names it; implies --enable-lora",
    )
    parser.add_argument(
        "--health-file",
        help="keep the worker's state here as JSON (starting, waiting_for_database, ready, "
        "draining, stopped) for a supervisor's probe",
    )
    add_switching_arguments(parser)
    online = parser.add_argument_group(
        "online API",
        "vLLM's OpenAI API for the worker's model, from the engine that runs the batches",
    )
    online.add_argument(
        "--online-port",
        type=int,
        help="serve vLLM's OpenAI routes on this port (default: off); batch requests then run "
        "at a lower priority (--scheduling-policy priority unless set) and back off while "
        "online requests are in the engine",
    )
    online.add_argument(
        "--online-host",
        default="127.0.0.1",
        help="the online API's address (default: 127.0.0.1); anything but loopback needs API keys",
    )
    online.add_argument(
        "--online-busy-window",
        type=int,
        help="batch requests kept in flight while online requests wait or run "
        f"(default: --max-num-seqs / {BUSY_WINDOW_DIVISOR}, {CPU_BUSY_WINDOW} on CPU); the newest "
        "beyond it are preempted and run again later",
    )
    online.add_argument(
        "--online-quiet-seconds",
        type=float,
        default=1.0,
        help="the batch window starts to grow back after online traffic has been quiet at "
        "least this long (default: 1.0)",
    )
    online.add_argument(
        "--online-quiet-gaps",
        type=float,
        default=5.0,
        help="... and at least this many times the mean gap between recent online arrivals "
        "(default: 5.0; at most 30 s in all)",
    )
    online.add_argument(
        "--online-regrow-seconds",
        type=float,
        default=0.5,
        help="then the batch window doubles this often until it is full again "
        "(default: 0.5; 0 restores it at once)",
    )
    parser.add_argument(
        "--enable-log-stats",
        action="store_true",
        help="log vLLM's engine statistics (default: off, they cost throughput)",
    )
    return parser


def vllm_parser(progress_bars: bool = True) -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import BaseFrontendArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="overnight worker", epilog=VLLM_HELP)
    parser = BaseFrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    # Batch bodies should carry cached_tokens as OpenAI's do.
    parser.set_defaults(enable_prompt_tokens_details=True)
    if not progress_bars:
        # A weight-loading bar in a JSON log stream is a line no collector can parse.
        parser.set_defaults(use_tqdm_on_load=False)
    return parser


def check_shared_arguments(argv: Sequence[str], prog: str) -> None:
    """Arguments for every worker of `overnight serve`: worker options and vLLM's engine
    arguments, parsed as a worker parses them (a bad one exits here, with the parser's
    message); not a model, since `serve` starts one worker per served model."""
    positional, rest = split_model(argv)
    ours, rest = own_parser().parse_known_args(rest)
    if positional or ours.model or ours.models:
        raise SystemExit(
            f"{prog}: a model is not an engine argument: serve starts a worker for each served "
            "model (OVERNIGHT_MODELS); choose among them with --models"
        )
    parser = vllm_parser()
    parser.prog = prog
    parser.parse_args(rest)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def split_model(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """A first argument that is not an option is the model (`vllm serve MODEL …`)."""
    if argv and not argv[0].startswith("-"):
        return argv[0], list(argv[1:])
    return None, list(argv)


def prepare_args(
    args: argparse.Namespace, settings: Settings, dtype_given: bool = False
) -> argparse.Namespace:
    """Resolve bundled models and fill the served name (and dtype) the deployment expects."""
    source = source_of(args.model, settings.models)
    resolved = resolve(source, settings.data_dir)
    choice = worker_dtype(args.dtype if dtype_given else None, resolved.amx_dtype)
    args.dtype, args.dtype_reason = choice.dtype, choice.reason
    log.info("dtype %s", choice)
    named = is_bundled(source) or source != args.model
    if named and not args.served_model_name:
        served = settings.served_model(args.model)
        args.served_model_name = [served.name if served else resolved.served_name]
    args.model = resolved.path
    if resolved.runner and getattr(args, "runner", "auto") == "auto":
        args.runner = resolved.runner
    if args.tokenizer is None and Path(resolved.path).is_dir():
        args.tokenizer = resolved.path
    return args


def parse(argv: Sequence[str] | None, settings: Settings) -> tuple[argparse.Namespace, Settings]:
    """overnight's options and vLLM's in one namespace, the model resolved."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg.startswith("--help=") for arg in argv):
        vllm_parser().parse_args(argv)  # vLLM prints the help asked for and exits
    positional, argv = split_model(argv)
    ours, rest = own_parser().parse_known_args(argv)
    if positional and ours.model and positional != ours.model:
        raise SystemExit(f"overnight worker: two models given: {positional} and {ours.model}")
    if ours.models and (positional or ours.model):
        raise SystemExit("overnight worker: give one model or --models, not both")
    ours.model = positional or ours.model or DEFAULT_MODEL
    if ours.data_dir:
        settings = settings.model_copy(update={"data_dir": Path(ours.data_dir)})
    # Before vLLM (and with it huggingface_hub, which reads the variable once) is imported.
    models = ours.models.split(",") if ours.models else [ours.model]
    sources = [source_of(m.strip(), settings.models) for m in models]
    if not ours.lora_repo and all(map(is_bundled, sources)):  # else the hub stays on
        stay_offline_for(sources[0])
    from app.logging import is_text

    args = vllm_parser(progress_bars=is_text(settings.log_format)).parse_args(rest)
    reserve_cpu_kv_cache(args.kv_cache_memory_bytes)
    # `--lora-dir` and `--lora-repo` are adapter sources of vLLM's LoRA, as `--lora-modules` is.
    args.enable_lora = bool(args.enable_lora or ours.lora_dir or ours.lora_repo)
    if ours.online_port is not None and (args.enable_lora or args.lora_modules) and _on_cpu():
        raise SystemExit(ONLINE_LORA_ON_CPU)
    if ours.online_port is not None and not _given(rest, "--scheduling-policy"):
        # Online requests first: vLLM's scheduler admits lower priority values first.
        args.scheduling_policy = "priority"
    vars(args).update(vars(ours))
    if not _given(rest, "--allowed-media-domains"):  # the deployment's hosts, checked by vLLM too
        from app.services.media_urls import MediaRule

        args.allowed_media_domains = MediaRule.of(settings).vllm_domains()
    # Per-step statistics cost throughput and are off in vLLM's offline runner too.
    args.disable_log_stats = args.disable_log_stats or not ours.enable_log_stats
    dtype_given = _given(rest, "--dtype")
    if ours.models:
        prepare = functools.partial(prepare_args, settings=settings, dtype_given=dtype_given)
        return switching_args(args, prepare), settings
    return prepare_args(args, settings, dtype_given), settings


# Batch lines are held apart by adapter (worker.adapters); online requests go straight to
# vLLM's app, so nothing would keep a base request out of an adapter's step.
ONLINE_LORA_ON_CPU = (
    "overnight worker: --online-port with LoRA adapters is refused on CPU: vLLM 0.32's CPU "
    "LoRA kernels answer a base-model request with an adapter's weights when both run in one "
    "engine step, and online requests are not held apart as batch lines are. Serve online "
    "from a worker without LoRA, or this worker's adapters in batches only."
)


def _given(argv: Sequence[str], flag: str) -> bool:
    """Whether vLLM's flag is on the command line (vLLM also takes it with underscores)."""
    spellings = (flag, flag.replace("_", "-"), "--" + flag[2:].replace("-", "_"))
    return any(arg.split("=", 1)[0] in spellings for arg in argv)


async def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Start the engine (and the online API, if asked), then work until SIGTERM/SIGINT."""
    import asyncio

    from worker.engine import start_engine
    from worker.health import Health
    from worker.loop import WorkerOptions, install_signal_handlers, work
    from worker.registry import LoadingBeat, new_worker_id

    stop = asyncio.Event()
    install_signal_handlers(stop)
    worker_id = args.worker_id or new_worker_id()
    health = Health(worker_id, args.health_file)
    if getattr(args, "choices", None):
        return await serve_models(args, settings, worker_id, health, stop)
    model = (args.served_model_name or [args.model])[0]
    online = _online_socket(args, settings)
    beat = LoadingBeat(settings, worker_id, model, every=settings.lease_seconds / 3)
    with beat:
        async with start_engine(args, online=online is not None) as engine:
            beat.ready()
            options = WorkerOptions(
                worker_id=worker_id,
                window=args.window,
                dedup=args.dedup,
                prefix_grouping=args.prefix_grouping,
                backoff=_backoff(args, engine) if online is not None else None,
            )
            log.info("worker %s serving %s", options.worker_id, ", ".join(engine.served_names))
            if online is None:
                return await work(settings, engine, options, health, stop)
            server = _online_server(engine, settings, *online)
            server.start()
            try:
                return await work(settings, engine, options, health, stop)
            finally:
                await server.stop()


def _backoff(args: argparse.Namespace, engine: Any) -> BackoffPolicy:
    """How far the batch window shrinks while online requests are in the engine."""
    from worker.backoff import BackoffPolicy

    busy = args.online_busy_window
    if busy is None:
        busy = CPU_BUSY_WINDOW if _on_cpu() else engine.max_num_seqs // BUSY_WINDOW_DIVISOR
    return BackoffPolicy(
        busy,
        quiet_seconds=args.online_quiet_seconds,
        quiet_gaps=args.online_quiet_gaps,
        regrow_seconds=args.online_regrow_seconds,
    )


def _online_socket(args: argparse.Namespace, settings: Settings) -> tuple[Any, Any] | None:
    """The online API's access decision and bound socket, or None when it is off."""
    if args.online_port is None:
        return None
    from app.cli import check_bind_safety
    from app.db.session import upgrade
    from worker.online import bind

    # Open mode is decided as the API decides it: loopback only without keys.
    upgrade(settings.sqlalchemy_url)
    access = check_bind_safety(settings.model_copy(update={"host": args.online_host}))
    return access, bind(args.online_host, args.online_port)


def _online_server(engine: Any, settings: Settings, access: Any, sock: Any) -> Any:
    from worker.online import OnlineServer

    return OnlineServer(engine.app, engine.traffic, settings, access, sock, engine.served_names[0])


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    """`overnight worker [MODEL] [options] [vLLM engine arguments]`; returns the exit code."""
    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        own_parser().print_help()  # at once: no engine, settings or database to import for it
        return 0
    import asyncio

    from app.config import get_settings
    from app.logging import configure_logging, route_vllm_logs
    from worker import process, python_gc
    from worker.media_guard import forbid_media_redirects

    python_gc.tune()
    forbid_media_redirects()
    settings = settings or get_settings()
    configure_logging(settings.log_level, settings.log_format)
    route_vllm_logs(settings.log_level, settings.log_format)
    try:
        args, settings = parse(argv, settings)
    except ModelNotFoundError as exc:
        return _fail(exc)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    process.install()
    try:
        return asyncio.run(serve(args, settings))
    except Exception as exc:
        if (reason := unavailable(exc, args.model)) is None:
            raise
        return _fail(reason)


def _fail(reason: Exception) -> int:
    print(f"overnight: error: {reason}", file=sys.stderr)
    return 1
