"""`python -m tests.fake_worker`: the worker process (start-up, loop, signals), scripted engine.

Fault tests kill, freeze and starve these processes; only the engine is scripted, so a
start costs a second instead of the real engine's thirty.
"""

import argparse
import asyncio
import logging
import sys

from app.config import get_settings
from tests.fake_engine import FakeEngine
from tests.submission_log import record_submissions
from worker.health import Health
from worker.loop import WorkerOptions, install_signal_handlers, work


async def _serve(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    install_signal_handlers(stop)
    health = Health(args.worker_id, args.health_file)
    if args.submission_log:
        record_submissions(args.submission_log, args.finished_log)
    options = WorkerOptions(worker_id=args.worker_id)
    return await work(get_settings(), FakeEngine(delay=args.delay), options, health, stop)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_worker")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--submission-log")
    parser.add_argument("--finished-log", help="with --submission-log: answers that came back")
    parser.add_argument("--health-file")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per request")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
