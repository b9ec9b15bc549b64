"""`overnight worker --models A,B,…`: the options of a worker switching models by demand
(`worker.switching`), and its start."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `overnight worker --help` answers without importing the service
    import asyncio

    from app.config import Settings
    from worker.health import Health

log = logging.getLogger("overnight.worker")

SWITCHING_REFUSES = (
    "overnight worker: --models takes each model's served name from the model (or "
    "OVERNIGHT_MODELS) and serves batches only: --served-model-name and --online-port need "
    "a worker of one model"
)


def add_switching_arguments(parser: argparse.ArgumentParser) -> None:
    switching = parser.add_argument_group(
        "several models",
        "one engine slot switching between models by demand, never in the middle of a shard",
    )
    switching.add_argument(
        "--models",
        metavar="A,B,...",
        help="serve these models (each as --model takes it) instead of one: hold the one whose "
        "queued work comes first under the scheduler's rules, switch when another's should",
    )
    switching.add_argument(
        "--min-residency",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="hold a model that still has work at least this long, and at least 4x what "
        "loading the next one cost (default: 60)",
    )
    switching.add_argument(
        "--sleep-level",
        type=int,
        choices=(1, 2),
        default=1,
        help="with --enable-sleep-mode (GPU): a left model's engine sleeps, its weights kept "
        "in host memory (1) or dropped (2), instead of stopping (default: 1)",
    )


def switching_args(
    args: argparse.Namespace, prepare: Callable[[argparse.Namespace], argparse.Namespace]
) -> argparse.Namespace:
    """`--models`: each model's own engine arguments (`prepare`d as one model's are), by the
    name its batches use, in `args.choices`. The engine arguments apply to every model, but
    `--max-model-len` to each at most up to its own length."""
    if args.served_model_name or args.online_port is not None:
        raise SystemExit(SWITCHING_REFUSES)
    if args.enable_sleep_mode and not _sleep_mode_available():
        log.warning("vLLM has no sleep mode on this platform: a switch restarts the engine")
        args.enable_sleep_mode = False
    args.choices = {}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        one = prepare(argparse.Namespace(**{**vars(args), "model": model}))
        if one.max_model_len is not None:  # one length for models of different lengths
            one.max_model_len = min(one.max_model_len, _model_length(one))
        args.choices[(one.served_model_name or [one.model])[0]] = one
    return args


def _model_length(args: argparse.Namespace) -> int:
    from worker.engine import model_length

    return model_length(args)


def _sleep_mode_available() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


async def serve_models(
    args: argparse.Namespace,
    settings: Settings,
    worker_id: str,
    health: Health,
    stop: asyncio.Event,
) -> int:
    from app.core.switching import SwitchRule
    from worker.loop import WorkerOptions
    from worker.switching import Switcher

    options = WorkerOptions(
        worker_id=worker_id,
        window=args.window,
        dedup=args.dedup,
        prefix_grouping=args.prefix_grouping,
    )
    log.info("worker %s switching between %s", worker_id, ", ".join(args.choices))
    sleep_level = args.sleep_level if args.enable_sleep_mode else None
    rule = SwitchRule(args.min_residency)
    return await Switcher(settings, args.choices, options, health, rule, sleep_level).run(stop)
