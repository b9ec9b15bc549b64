"""The batch phase of overnight's worker against vLLM's `run_batch`, on one warm engine.

    .venv/bin/python bench/bench_phase.py [--requests 512] [--max-tokens 64] [--rounds 4]
        [--sizes default,128/2048] [--runners run_batch,worker] [--scripted SECONDS]
        [vLLM engine arguments]

bench_worker.py times whole deployments, so its differences of a second or two drown in
engine starts and a shared machine's noise. Here one engine serves both, in one process,
the prefix cache reset before every run, rounds alternating:
  run_batch  vLLM's own `run_batch()` coroutine ("Reading batch" → "Writing outputs"),
  worker     overnight's worker loop on SQLite (batch in_progress → finalizing).
Each run reports its timeline (first request into vLLM, last answer out) and how many
requests vLLM held (waiting + running) over the run, sampled every 0.1 s. `--scripted SECONDS`
runs the worker alone on a scripted engine instead: its own cost around the engine (claim,
shard set-up, last checkpoint, finalizer), without a model.
"""

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_worker import ENV, MAX_MODEL_LEN, MODEL, chats, input_file  # noqa: E402

SAMPLE_SECONDS = 0.1


@dataclass
class Run:
    runner: str
    phase: float
    first_in: float  # the phase's start → first request held by vLLM
    last_out: float  # the phase's start → vLLM held none again
    held: list[int] = field(default_factory=list)

    def occupancy(self, max_num_seqs: int) -> str:
        busy = [h for h in self.held if h]
        full = sum(h >= max_num_seqs for h in busy)
        return (
            f"held median {median(busy) if busy else 0:.0f}, "
            f"max {max(busy, default=0)}, ≥ max_num_seqs in {full}/{len(busy)} samples"
        )


class Sampler:
    """How many requests the engine holds, every 0.1 s, and when it first and last held any."""

    def __init__(self, held: Callable[[], int], every: float) -> None:
        self.count = held
        self.every = every
        self.held: list[int] = []
        self.first: float | None = None
        self.last = 0.0

    async def run(self) -> None:
        while True:
            held = self.count()
            now = time.monotonic()
            if held and self.first is None:
                self.first = now
            if held:
                self.last = now
            self.held.append(held)
            await asyncio.sleep(self.every)


class Stamps(logging.Handler):
    """Times of the log lines that start and end run_batch's batch phase."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        for mark in ("Reading batch from", "Writing outputs to"):
            if record.getMessage().startswith(mark):
                self.seen[mark] = time.monotonic()


async def sampled(
    held: Callable[[], int], work: Any, every: float = SAMPLE_SECONDS
) -> tuple[Sampler, Any]:
    sampler = Sampler(held, every)
    task = asyncio.create_task(sampler.run())
    try:
        return sampler, await work
    finally:
        task.cancel()


async def run_vllm(client: Any, args: Any) -> Run:
    from vllm.entrypoints.launchers import run_batch

    stamps = Stamps()
    run_batch.logger.addHandler(stamps)
    try:
        sampler, _ = await sampled(
            client.get_num_unfinished_requests, run_batch.run_batch(client, args)
        )
    finally:
        run_batch.logger.removeHandler(stamps)
    start, end = stamps.seen["Reading batch from"], stamps.seen["Writing outputs to"]
    return Run(
        "run_batch", end - start, (sampler.first or end) - start, sampler.last - start, sampler.held
    )


def held_by(engine: Any) -> Callable[[], int]:
    """Requests inside the engine: vLLM's unfinished ones, or the scripted engine's running."""
    client = getattr(engine, "client", None)
    return client.get_num_unfinished_requests if client else lambda: int(engine.running)


class Overnight:
    """A worker on its own SQLite deployment, fed one batch per run."""

    def __init__(
        self,
        engine: Any,
        work: Path,
        source: Path,
        window: int | None,
        sample_seconds: float = SAMPLE_SECONDS,
    ) -> None:
        from app.config import Settings
        from app.db.session import upgrade
        from worker.loop import Worker, WorkerOptions

        self.settings = Settings(data_dir=work, _env_file=None)  # type: ignore[call-arg]
        self.settings.data_dir.mkdir(parents=True)
        upgrade(self.settings.sqlalchemy_url)
        self.source = source
        self.held = held_by(engine)
        self.sample_seconds = sample_seconds
        self.worker = Worker(self.settings, engine, WorkerOptions("bench", window=window))
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.worker.run(self.stop))

    def _create(self) -> str:
        from app.db.session import session_scope
        from app.schemas.batches import CreateBatchRequest
        from app.services import batches
        from app.services.auth import DEFAULT_PROJECT, ensure_project
        from tests import batch_sim

        file_id = batch_sim.store_input_file(self.settings, self.source.read_bytes())
        with session_scope(self.settings) as session:
            project = ensure_project(session, DEFAULT_PROJECT).id
            request = CreateBatchRequest(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            return batches.create_batch(session, self.settings, project, request).id

    def _status(self, batch_id: str) -> str:
        from tests import batch_sim

        return str(batch_sim.load_batch(self.settings, batch_id).status)

    async def run(self) -> Run:
        from app.services.steps.validation import validate_pending

        batch_id = await asyncio.to_thread(self._create)
        await asyncio.to_thread(validate_pending, self.settings, "bench")
        start = time.monotonic()  # validation just set it in_progress

        async def finalizing() -> float:
            while await asyncio.to_thread(self._status, batch_id) == "in_progress":
                await asyncio.sleep(min(0.05, self.sample_seconds))
            return time.monotonic()

        sampler, end = await sampled(self.held, finalizing(), self.sample_seconds)
        return Run(
            "worker",
            end - start,
            (sampler.first or end) - start,
            sampler.last - start,
            sampler.held,
        )

    async def close(self) -> None:
        self.stop.set()
        await self.task


@dataclass
class Setup:
    """One engine sizing, with both runners on it."""

    label: str
    engine: Any
    batch_args: Any
    overnight: "Overnight"


async def scripted(cli: argparse.Namespace) -> None:
    """The worker alone on a scripted engine: what it costs around the engine, no model."""
    from tests.fake_engine import FakeEngine

    work = Path(tempfile.mkdtemp(prefix="overnight-phase-"))
    source = input_file(chats(cli.requests, repetitive=False), cli.max_tokens, work / "in.jsonl")
    engine = FakeEngine(delay=cli.scripted, max_num_seqs=256)
    overnight = Overnight(engine, work / "deployment", source, cli.window, sample_seconds=0.005)
    await asyncio.sleep(1.0)  # started and idle, as a deployment waits for work
    runs = []
    for _ in range(cli.rounds):
        run = await overnight.run()
        runs.append(run)
        print(
            f"worker on a {cli.scripted} s scripted engine: phase {run.phase:.3f} s, first in "
            f"{run.first_in * 1000:.0f} ms, last out → finalizing "
            f"{(run.phase - run.last_out) * 1000:.0f} ms",
            flush=True,
        )
        await asyncio.sleep(0.5)
    await overnight.close()
    print(
        f"median: first in {median(r.first_in for r in runs) * 1000:.0f} ms, "
        f"overhead beyond the engine {median(r.phase for r in runs) - cli.scripted:.3f} s"
    )


async def bench(cli: argparse.Namespace, engine_argv: list[str]) -> None:
    from contextlib import AsyncExitStack

    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from app.config import Settings
    from worker import cli as worker_cli
    from worker.engine import start_engine
    from worker.models import ensure_converted

    work = Path(tempfile.mkdtemp(prefix="overnight-phase-"))
    model_dir = ensure_converted(Path(tempfile.gettempdir()) / "overnight-phase-model")
    source = input_file(chats(cli.requests, repetitive=False), cli.max_tokens, work / "in.jsonl")
    common = ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN), *engine_argv]
    runs: list[tuple[str, Run]] = []
    async with AsyncExitStack() as stack:
        setups: list[Setup] = []
        for n, size in enumerate(cli.sizes.split(",")):
            flags = [*common]
            if size != "default":
                seqs, tokens = size.split("/")
                flags += ["--max-num-seqs", seqs, "--max-num-batched-tokens", tokens]
            args, _ = worker_cli.parse([str(model_dir), *flags], Settings(_env_file=None))  # type: ignore[call-arg]
            batch_args = make_arg_parser(FlexibleArgumentParser()).parse_args(
                [
                    "-i",
                    str(source),
                    "-o",
                    str(work / "out.jsonl"),
                    "--model",
                    str(model_dir),
                    *flags,
                ]
            )
            engine = await stack.enter_async_context(start_engine(args))
            sched = engine.client.vllm_config.scheduler_config
            label = f"{sched.max_num_seqs}/{sched.max_num_batched_tokens}"
            print(f"engine {label}: flags {' '.join(flags)}", flush=True)
            overnight = Overnight(engine, work / f"deployment-{n}", source, cli.window)
            stack.push_async_callback(overnight.close)
            setups.append(Setup(label, engine, batch_args, overnight))
        for _ in range(cli.rounds):
            for setup in setups:
                for runner in cli.runners.split(","):
                    await setup.engine.client.reset_prefix_cache()
                    run = await (
                        run_vllm(setup.engine.client, setup.batch_args)
                        if runner == "run_batch"
                        else setup.overnight.run()
                    )
                    runs.append((setup.label, run))
                    print(
                        f"{setup.label:<10} {run.runner:<9} phase {run.phase:6.2f} s  "
                        f"first in {run.first_in:5.2f}  last out {run.last_out:6.2f}  "
                        f"{run.occupancy(setup.engine.max_num_seqs)}",
                        flush=True,
                    )
    for label in dict.fromkeys(label for label, _ in runs):
        for runner in cli.runners.split(","):
            phases = [r.phase for size, r in runs if size == label and r.runner == runner]
            print(
                f"{label:<10} {runner:<9} median {median(phases):6.2f} s, best "
                f"{min(phases):6.2f} s, every round {', '.join(f'{p:.2f}' for p in phases)}"
            )


def main() -> None:
    import os

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=int)
    parser.add_argument(
        "--sizes",
        default="default",
        help="engines to start, comma-separated: `default` (the worker's) or SEQS/TOKENS",
    )
    parser.add_argument("--runners", default="run_batch,worker")
    parser.add_argument(
        "--scripted",
        type=float,
        metavar="SECONDS",
        help="no model: the worker alone on a scripted engine answering after SECONDS",
    )
    cli, engine_argv = parser.parse_known_args()
    os.environ.update({k: v for k, v in ENV.items() if k not in os.environ})
    asyncio.run(scripted(cli) if cli.scripted else bench(cli, engine_argv))


if __name__ == "__main__":
    main()
