"""Online and batch on one engine: online latency beside a batch, and the batch's throughput.

    .venv/bin/python bench/bench_online.py [--requests 512] [--rate 1.0] [--alone-seconds 30]
        [--busy-windows 8,4,2] [--quiet-gaps 5] [--model-dir DIR]

One `overnight api` and, in turn, `overnight worker --online-port` in these settings (the
bundled SmolLM2, bench_worker's engine flags and input):
  (a) online alone: Poisson arrivals of streamed chat requests (`max_tokens` 32) for
      `--alone-seconds`, TTFT and end-to-end latency;
  (b) the same online stream while a batch of `--requests` runs on the same worker, for each
      `--busy-windows` setting (the batch requests kept in flight while online ones are in the
      engine; the window grows back, doubling every 0.5 s, once the quiet has lasted
      `--quiet-gaps` times the mean gap between online arrivals); the stream starts 5 s
      before the batch, and those first seconds are not counted;
  (c) the same batch with no online traffic, against raw vLLM `LLM.chat` (bench_worker's (a));
  (d) naive co-location: the same batch and online stream on a worker fed at the full window
      with no priority (`--scheduling-policy fcfs --online-busy-window` = the full window).
Batch tokens/s are output tokens over the batch's in_progress -> finalizing time.
"""

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_worker import (  # noqa: E402
    ENV,
    MODEL,
    chats,
    engine_flags,
    input_file,
    run_batch_through_sdk,
    run_raw,
    stop,
    texts_of,
    wait_until_serving,
)
from tests.harness import free_port  # noqa: E402
from worker.backoff import MAX_QUIET_SECONDS  # noqa: E402
from worker.dtype import worker_dtype  # noqa: E402
from worker.models import SMOLLM2_AMX_DTYPE  # noqa: E402

ONLINE_MAX_TOKENS = 32
# The worker's own dtype for SmolLM2 here, for the workers and raw LLM.chat alike.
DTYPE = worker_dtype(None, SMOLLM2_AMX_DTYPE).dtype
# In (b) and (d) the online stream runs this long before the batch starts, uncounted: the
# batch then meets online traffic already there (a first request after a long quiet meets the
# full window instead, see the README).
LEAD_SECONDS = 5.0
QUESTIONS = [
    "What is a good name for a cat?",
    "Give me one tip for sleeping well.",
    "What colour is the sky at dusk?",
    "Name a fruit that is rich in vitamin C.",
]


@dataclass
class Latencies:
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    failed: int = 0

    @staticmethod
    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def cells(self) -> str:
        p = self.percentile
        return (
            f"{len(self.total)} | {p(self.ttft, 0.5):.3f} | {p(self.ttft, 0.99):.3f} | "
            f"{p(self.total, 0.5):.2f} | {p(self.total, 0.99):.2f}"
        )


async def _one(client: object, question: str, into: Latencies, counted: float) -> None:
    started = time.monotonic()
    first = None
    try:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=ONLINE_MAX_TOKENS,
            stream=True,
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
    except Exception:
        into.failed += started >= counted
        return
    if started < counted:
        return
    into.ttft.append((first or time.monotonic()) - started)
    into.total.append(time.monotonic() - started)


async def poisson_stream(url: str, rate: float, load: "OnlineLoad", seed: int) -> Latencies:
    """Streamed chat requests at Poisson arrivals until `load.done`; each measured to its end
    (those that started before `load.counted` are not counted)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    rng = random.Random(seed)
    latencies = Latencies()
    running: set[asyncio.Task[None]] = set()
    while not load.done.is_set():
        await asyncio.sleep(rng.expovariate(rate))
        question = rng.choice(QUESTIONS)
        task = asyncio.create_task(_one(client, question, latencies, load.counted))
        running.add(task)
        task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    await client.close()
    return latencies


class OnlineLoad:
    """The Poisson stream in a thread of its own, from start() to finish()."""

    def __init__(self, url: str, rate: float, seed: int = 7) -> None:
        self.done = threading.Event()
        self.counted = 0.0
        self.result = Latencies()
        self.thread = threading.Thread(
            target=lambda: setattr(
                self, "result", asyncio.run(poisson_stream(url, rate, self, seed))
            )
        )

    def start(self, lead: float = 0.0) -> "OnlineLoad":
        """Starts the stream; counts only the requests sent after `lead` seconds."""
        self.counted = time.monotonic() + lead
        self.thread.start()
        time.sleep(lead)
        return self

    def finish(self) -> Latencies:
        self.done.set()
        self.thread.join()
        return self.result


class Rows(list[str]):
    """The table's rows, each also printed as soon as it is measured."""

    def append(self, row: str) -> None:
        print(row, flush=True)
        super().append(row)


class Worker:
    """`overnight worker --online-port` on the API's data directory."""

    def __init__(self, model_dir: Path, data: Path, name: str, flags: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data / f"{name}.log"
        command = [sys.executable, "-m", "app.cli", "worker", "--model", str(model_dir)]
        command += ["--served-model-name", MODEL, *engine_flags(DTYPE)]
        command += ["--online-port", str(self.port), *flags]
        env = {**ENV, "OVERNIGHT_DATA_DIR": str(data)}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )
        wait_until_serving(self.log, 1, self.process)
        warm = OnlineLoad(self.url, rate=5.0).start()
        time.sleep(2)
        warm.finish()

    def stop(self) -> None:
        stop(self.process)


def batch_rate(api_port: int, source: Path, count: int, worker: Worker) -> float:
    run = run_batch_through_sdk(api_port, source, {"worker": worker.process.pid})
    _texts, tokens = texts_of(run.output, count)
    return tokens / run.running


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=1.0, help="online requests per second")
    parser.add_argument("--alone-seconds", type=float, default=30.0)
    parser.add_argument("--busy-windows", default="8,4,2")
    parser.add_argument("--quiet-gaps", default="5")
    parser.add_argument("--model-dir", type=Path, help="an already converted SmolLM2 folder")
    args = parser.parse_args()

    from worker.models import ensure_converted

    work = Path(tempfile.mkdtemp(prefix="overnight-bench-online-"))
    model_dir = args.model_dir or ensure_converted(work)
    messages = chats(args.requests, repetitive=False)
    source = input_file(messages, args.max_tokens, work / "batch.jsonl")
    raw = run_raw(model_dir, messages, args.max_tokens, work, DTYPE)
    print(f"raw LLM.chat: {raw.rate:.1f} tok/s", flush=True)

    data = work / "data"
    data.mkdir()
    api_port = free_port()
    env = {**ENV, "OVERNIGHT_DATA_DIR": str(data)}
    api = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "api", "--port", str(api_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    rows = Rows()
    try:
        busy = [int(b) for b in args.busy_windows.split(",")]
        backoff = ["--online-quiet-gaps", args.quiet_gaps]
        first = ["--online-busy-window", str(busy[0]), *backoff]
        worker = Worker(model_dir, data, "w-first", first)
        load = OnlineLoad(worker.url, args.rate).start()
        time.sleep(args.alone_seconds)
        alone = load.finish()
        rows.append(f"| (a) online alone | {alone.cells()} | | |")
        # No online traffic means none lately either: wait out the longest quiet period and the
        # window's regrowth, or (c) would start with a shrunken window.
        time.sleep(MAX_QUIET_SECONDS + 10)
        alone_rate = batch_rate(api_port, source, args.requests, worker)
        rows.append(
            f"| (c) batch alone, online port on | | | | | | {alone_rate:.1f} | "
            f"{alone_rate / raw.rate:.3f} |"
        )
        for i, window in enumerate(busy):
            if i:
                worker.stop()
                flags = ["--online-busy-window", str(window), *backoff]
                worker = Worker(model_dir, data, f"w{window}", flags)
            load = OnlineLoad(worker.url, args.rate).start(LEAD_SECONDS)
            rate = batch_rate(api_port, source, args.requests, worker)
            both = load.finish()
            rows.append(
                f"| (b) online + batch, busy window {window} | {both.cells()} | {rate:.1f} | "
                f"{rate / raw.rate:.3f} |"
            )
        worker.stop()
        naive_flags = ["--scheduling-policy", "fcfs", "--online-busy-window", "100000"]
        worker = Worker(model_dir, data, "w-naive", naive_flags)
        load = OnlineLoad(worker.url, args.rate).start(LEAD_SECONDS)
        rate = batch_rate(api_port, source, args.requests, worker)
        both = load.finish()
        rows.append(
            f"| (d) naive: full window, no priority | {both.cells()} | {rate:.1f} | "
            f"{rate / raw.rate:.3f} |"
        )
        worker.stop()
    finally:
        stop(api)
    print(
        f"\n{args.requests} batch requests (max_tokens {args.max_tokens}); online: Poisson "
        f"{args.rate}/s, streamed, max_tokens {ONLINE_MAX_TOKENS}; quiet gaps "
        f"{args.quiet_gaps}; raw LLM.chat "
        f"{raw.rate:.1f} tok/s\n"
    )
    print(
        "| run | online requests | TTFT p50 s | TTFT p99 s | latency p50 s | latency p99 s "
        "| batch tok/s | vs LLM.chat |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
