"""`overnight worker`: every vLLM engine argument passes through to the engine.

The parser is vLLM's own (`FlexibleArgumentParser` + `AsyncEngineArgs.add_cli_args` and the
OpenAI frontend's arguments), with a few of ours in an `overnight` group.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app.config import Settings
from worker.models import BUNDLED_PREFIX, resolve

DEFAULT_MODEL = "bundled:smollm2"


def build_parser() -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import BaseFrontendArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="overnight worker",
        description="Run batch requests on an embedded vLLM engine. "
        "Every vLLM engine argument is accepted (see below).",
    )
    ours = parser.add_argument_group("overnight")
    ours.add_argument("--data-dir", help="the deployment's data directory (OVERNIGHT_DATA_DIR)")
    ours.add_argument("--worker-id", help="a stable name for this worker (default: host:pid)")
    ours.add_argument(
        "--window",
        type=int,
        help="requests kept in flight in the engine (default: 2 x --max-num-seqs)",
    )
    ours.add_argument(
        "--no-dedup",
        dest="dedup",
        action="store_false",
        help="run identical deterministic requests once each instead of once in all",
    )
    ours.add_argument(
        "--no-prefix-grouping",
        dest="prefix_grouping",
        action="store_false",
        help="submit requests in input order instead of grouping shared prompt prefixes",
    )
    ours.add_argument(
        "--submission-log",
        help="append `batch_id line` for every request sent to the engine (for audits and tests)",
    )
    ours.add_argument(
        "--enable-log-stats",
        dest="disable_log_stats",
        action="store_false",
        help="log vLLM's engine statistics (off by default: they cost throughput)",
    )
    parser = BaseFrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    # Batch bodies should carry cached_tokens as OpenAI's do. Per-step engine statistics
    # cost throughput and are off in vLLM's offline runner too (the worker reports tokens/s).
    parser.set_defaults(
        model=DEFAULT_MODEL, enable_prompt_tokens_details=True, disable_log_stats=True
    )
    if _on_cpu():
        # torch.compile needs a C++ toolchain and minutes of start-up for a small gain on CPU.
        parser.set_defaults(enforce_eager=True)
    return parser


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def model_source(model: str, settings: Settings) -> str:
    """`--model` may name a served model of the settings (`all-MiniLM-L6-v2`)."""
    served = settings.served_model(model)
    return served.source if served and served.source else model


def prepare_args(args: argparse.Namespace, settings: Settings) -> argparse.Namespace:
    """Resolve bundled models and fill the served name the deployment expects."""
    source = model_source(args.model, settings)
    resolved = resolve(source, settings.data_dir)
    named = source.startswith(BUNDLED_PREFIX) or source != args.model
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
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.data_dir:
        settings = settings.model_copy(update={"data_dir": Path(args.data_dir)})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return prepare_args(args, settings), settings


async def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Start the engine, then work until SIGTERM/SIGINT."""
    import asyncio

    from worker.engine import start_engine
    from worker.loop import Worker, WorkerOptions, install_signal_handlers
    from worker.registry import new_worker_id

    stop = asyncio.Event()
    install_signal_handlers(stop)
    async with start_engine(args) as engine:
        options = WorkerOptions(
            worker_id=args.worker_id or new_worker_id(),
            window=args.window,
            dedup=args.dedup,
            prefix_grouping=args.prefix_grouping,
            submission_log=args.submission_log,
        )
        print(
            f"overnight: worker {options.worker_id} serving {', '.join(engine.served_names)}",
            file=sys.stderr,
            flush=True,
        )
        return await Worker(settings, engine, options).run(stop)


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    """`overnight worker [--data-dir D] [vLLM engine arguments...]`."""
    import asyncio

    from app.config import get_settings
    from app.db.session import upgrade
    from worker import process

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args, settings = parse(argv, settings or get_settings())
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.sqlalchemy_url)
    process.install()
    return asyncio.run(serve(args, settings))
