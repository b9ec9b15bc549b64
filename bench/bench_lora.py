"""The cost of LoRA adapters per line, and of their order in the input file.

One real worker (the bundled SmolLM2, `--enable-lora`, eight rank-4 adapters built here with
`peft`, seeded; content is not judged) behind the real API on SQLite runs, one after another,
the same N chat lines (greedy, `--max-tokens` each) as three batches:

  base        every line names the base model;
  interleaved line i names adapter i mod 8 (input order: every neighbour differs);
  grouped     the same lines, sorted by adapter.

Each batch's time from creation to `completed`, lines/s and its ratio to the base batch. The
worker groups the lines of its pool by adapter (at most `--max-loras` in flight, never the base
beside adapters on CPU: `worker.adapters`), so "interleaved" shows what that grouping recovers
against a file that is grouped already.

    .venv/bin/python bench/bench_lora.py [--lines 2000] [--max-tokens 8] [--max-loras 4]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.config import Settings  # noqa: E402
from tests.engine_fixtures import (  # noqa: E402
    MODEL,
    Deployment,
    chat_line,
    jsonl,
    serving,
    smollm2_args,
    start_batch,
    wait_status,
)
from tests.harness import fresh_database  # noqa: E402
from tests.test_lora import build_adapter  # noqa: E402

ADAPTERS = 8
TOPICS = ["rain", "cats", "the sea", "bread", "trains", "winter", "music", "stars", "maps"]


def prompts(n: int) -> list[str]:
    return [f"Write one sentence about {TOPICS[i % len(TOPICS)]} (note {i})." for i in range(n)]


def batch_lines(texts: list[str], models: list[str], max_tokens: int) -> bytes:
    body = {"temperature": 0, "max_tokens": max_tokens}
    lines = [
        chat_line(f"line-{i}", text, model, **body)
        for i, (text, model) in enumerate(zip(texts, models, strict=True))
    ]
    return jsonl(lines)


def timed(client: openai.OpenAI, data: bytes) -> float:
    started = time.monotonic()
    batch = wait_status(client, start_batch(client, data), "completed", "failed", timeout=7200)
    assert batch.status == "completed", batch
    counts = batch.request_counts
    assert counts is not None and counts.failed == 0, counts
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--shard-lines", type=int, default=500)
    args = parser.parse_args()
    from worker.models import ensure_converted

    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        work = Path(tmp)
        model_dir = ensure_converted(work / "models-data")
        names = [f"adapter-{k}" for k in range(ADAPTERS)]
        modules = [
            f"{n}={build_adapter(model_dir, work / n, zero_b=False, seed=k)}"
            for k, n in enumerate(names)
        ]
        lora = ["--enable-lora", "--max-loras", str(args.max_loras), "--max-lora-rank", "8"]
        texts = prompts(args.lines)
        interleaved = [names[i % ADAPTERS] for i in range(args.lines)]
        order = sorted(range(args.lines), key=lambda i: interleaved[i])
        runs = {
            "base": batch_lines(texts, [MODEL] * args.lines, args.max_tokens),
            "interleaved": batch_lines(texts, interleaved, args.max_tokens),
            "grouped": batch_lines(
                [texts[i] for i in order], [interleaved[i] for i in order], args.max_tokens
            ),
        }
        data_dir = work / "deployment"
        data_dir.mkdir()
        with fresh_database("sqlite", data_dir, migrated=True) as url:
            settings = Settings(  # type: ignore[call-arg]
                data_dir=data_dir, database_url=url, shard_lines=args.shard_lines, _env_file=None
            )
            with serving(settings, Deployment) as running:
                worker = running.start_worker(
                    "bench", [*smollm2_args(model_dir), *lora, "--lora-modules", *modules]
                )
                worker.wait_ready(timeout=900)
                client = running.client()
                timed(client, batch_lines(texts[:16], [MODEL] * 16, args.max_tokens))  # warm up
                seconds = {name: timed(client, data) for name, data in runs.items()}
    print(
        f"{args.lines} lines, max_tokens {args.max_tokens}, {ADAPTERS} adapters, "
        f"--max-loras {args.max_loras}, shards of {args.shard_lines}"
    )
    print(f"{'batch':<12} {'seconds':>8} {'lines/s':>8} {'vs base':>8}")
    for name, spent in seconds.items():
        ratio = spent / seconds["base"]
        print(f"{name:<12} {spent:>8.1f} {args.lines / spent:>8.1f} {ratio:>7.2f}x")


if __name__ == "__main__":
    main()
