"""Throughput of the worker against vLLM's own offline paths, and its memory on a big batch.

    .venv/bin/python bench/bench_worker.py [--requests 512] [--max-tokens 64] [--skip-memory]

Same generated input, model (the bundled SmolLM2) and engine settings for every runner:
  (a) raw vLLM `LLM.chat`, (b) `python -m vllm.entrypoints.openai.run_batch`,
  (c) overnight end to end (API + worker subprocesses: upload → completed → download);
then a realistic-repetition input (one shared system prompt, a quarter exact duplicates)
through (a) and through overnight with and without prefix grouping + dedup; then the
worker's RSS on a 50,000-line batch, run by the real worker loop with a scripted engine
(a real engine at ~300 tokens/s would need hours for it).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "SmolLM2-135M-Instruct"
ENGINE = {"enforce_eager": True, "max_model_len": 2048}
ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "2048"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
SYSTEM = (
    "You are a careful assistant for a travel company. Answer in one short paragraph, "
    "mention prices in euros, never invent opening hours, and always suggest one nearby "
    "alternative. Keep a friendly, professional tone and avoid lists. "
) * 3


def chats(n: int, repetitive: bool) -> list[list[dict[str, str]]]:
    topics = ["Paris", "Rome", "Lisbon", "Berlin", "Vienna", "Prague", "Madrid", "Oslo"]
    out: list[list[dict[str, str]]] = []
    for i in range(n):
        if repetitive and i % 4 == 3:
            out.append(out[i - 1])  # an exact duplicate
            continue
        question = (
            f"Question {i}: what should I see in {topics[i % len(topics)]} on day {i % 7 + 1}?"
        )
        messages = [{"role": "user", "content": question}]
        out.append([{"role": "system", "content": SYSTEM}, *messages] if repetitive else messages)
    return out


def input_file(messages: list[list[dict[str, str]]], max_tokens: int, path: Path) -> Path:
    with open(path, "wb") as f:
        for i, m in enumerate(messages):
            body = {"model": MODEL, "messages": m, "max_tokens": max_tokens, "temperature": 0}
            line = {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
            f.write(orjson.dumps(line) + b"\n")
    return path


# -- (a) raw LLM.chat, in a child process so that each runner starts cold --
def raw_llm_child(model_dir: str, source: str, max_tokens: int, target: str) -> None:
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=model_dir, **ENGINE)
    ready = time.monotonic()
    messages = json.loads(Path(source).read_text())
    outputs = llm.chat(
        messages, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False
    )
    done = time.monotonic()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {"wall": done - started, "phase": done - ready, "tokens": tokens}
    Path(target).write_text(json.dumps(result))


def run_raw(model_dir: Path, messages: list[Any], max_tokens: int, work: Path) -> dict[str, float]:
    source, target = work / "raw.json", work / "raw.result.json"
    source.write_text(json.dumps(messages))
    subprocess.run(
        [
            sys.executable,
            __file__,
            "_raw",
            str(model_dir),
            str(source),
            str(max_tokens),
            str(target),
        ],
        env=ENV,
        capture_output=True,
        check=True,
    )
    result: dict[str, float] = json.loads(target.read_text())
    return result


# -- (b) vLLM's run_batch --
def run_vllm_batch(model_dir: Path, source: Path, work: Path) -> dict[str, float]:
    target = work / "run_batch.out.jsonl"
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.run_batch",
            "-i",
            str(source),
            "-o",
            str(target),
            "--model",
            str(model_dir),
            "--served-model-name",
            MODEL,
            *ENGINE_ARGS,
        ],
        env=ENV,
        capture_output=True,
        check=True,
    )
    wall = time.monotonic() - started
    tokens = sum(
        orjson.loads(raw)["response"]["body"]["usage"]["completion_tokens"]
        for raw in target.read_bytes().splitlines()
    )
    return {"wall": wall, "phase": float("nan"), "tokens": tokens}


# -- (c) overnight: API + worker subprocesses --
class Overnight:
    def __init__(self, model_dir: Path, work: Path, *worker_flags: str) -> None:
        from tests.harness import free_port

        self.data = work / f"overnight-{len(list(work.glob('overnight-*')))}"
        self.port = free_port()
        # Default housekeeping: batch creation wakes the validator, the worker finalizes.
        env = {**ENV, "OVERNIGHT_DATA_DIR": str(self.data)}
        self.started = time.monotonic()
        self.api = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
        )
        self.data.mkdir(parents=True, exist_ok=True)
        self.worker_log = open(self.data / "worker.log", "wb")  # noqa: SIM115
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "worker",
                "--model",
                str(model_dir),
                "--served-model-name",
                MODEL,
                *ENGINE_ARGS,
                *worker_flags,
            ],
            env=env,
            stdout=self.worker_log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def wait_ready(self) -> None:
        log = self.data / "worker.log"
        while b"overnight: worker" not in log.read_bytes():
            assert self.worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)

    def run(self, source: Path) -> dict[str, float]:
        import openai

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=5
        )
        started = time.monotonic()
        file_id = client.files.create(
            file=(source.name, source.read_bytes(), "application/jsonl"), purpose="batch"
        ).id
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(0.25)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed", batch
        data = client.files.content(batch.output_file_id or "").content
        done = time.monotonic()
        tokens = sum(
            orjson.loads(raw)["response"]["body"]["usage"]["completion_tokens"]
            for raw in data.splitlines()
        )
        return {
            "wall": done - self.started,
            "phase": done - started,
            "tokens": tokens,
            "engine": self.engine_seconds(),
        }

    def engine_seconds(self) -> float:
        """From the first claim to the last shard done, by the worker's log."""
        stamps = [
            datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in (self.data / "worker.log").read_text(errors="replace").splitlines()
            if " overnight.worker INFO " in line and (" claimed shard " in line or ": done" in line)
        ]
        return max(stamps) - min(stamps) if stamps else float("nan")

    def close(self) -> None:
        for process in (self.worker, self.api):
            process.send_signal(signal.SIGTERM)
        for process in (self.worker, self.api):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        self.worker_log.close()


def run_overnight(model_dir: Path, source: Path, work: Path, *flags: str) -> dict[str, float]:
    deployment = Overnight(model_dir, work, *flags)
    try:
        deployment.wait_ready()
        return deployment.run(source)
    finally:
        deployment.close()


# -- memory: the worker loop on 50,000 lines, scripted engine, RSS sampled in the child --
def memory_child(lines: int, target: str) -> None:
    import asyncio
    import threading

    import psutil
    from sqlalchemy import select

    from app.config import Settings
    from app.db.session import session_factory, upgrade
    from app.schemas.batches import CreateBatchRequest
    from app.services import batches
    from app.services.auth import DEFAULT_PROJECT, ensure_project
    from app.services.validation import validate_pending
    from tests import batch_sim
    from tests.fake_engine import FakeEngine
    from worker.loop import Worker, WorkerOptions

    work = Path(tempfile.mkdtemp(prefix="overnight-mem-"))
    settings = Settings(data_dir=work, shard_lines=1000, _env_file=None)  # type: ignore[call-arg]
    upgrade(settings.sqlalchemy_url)
    file_id = batch_sim.store_input_file(
        settings, (batch_sim.request_line(f"r{i}") + b"\n" for i in range(lines))
    )
    with session_factory(settings.sqlalchemy_url)() as session:
        project = ensure_project(session, DEFAULT_PROJECT).id
        request = CreateBatchRequest(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch_id = batches.create_batch(session, settings, project, request).id
    validate_pending(settings, "bench")
    process = psutil.Process()
    samples: list[int] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(0.2):
            samples.append(process.memory_info().rss)

    async def main() -> float:
        stop = asyncio.Event()
        worker = Worker(
            settings, FakeEngine(delay=0.002, max_num_seqs=256), WorkerOptions(worker_id="bench")
        )
        task = asyncio.create_task(worker.run(stop))
        started = time.monotonic()
        from app.db.models import Batch
        from app.db.session import session_scope

        while True:
            await asyncio.sleep(0.5)
            with session_scope(settings) as session:
                status = session.scalar(select(Batch.status).where(Batch.id == batch_id))
                if status == "completed":
                    break
        elapsed = time.monotonic() - started
        stop.set()
        await task
        return elapsed

    baseline = process.memory_info().rss
    threading.Thread(target=sample, daemon=True).start()
    elapsed = asyncio.run(main())
    stop_sampling.set()
    peak = max(samples, default=baseline)
    result = {"lines": lines, "seconds": elapsed, "baseline": baseline, "peak": peak}
    Path(target).write_text(json.dumps(result))


def run_memory(lines: int, work: Path) -> dict[str, float]:
    target = work / "memory.result.json"
    subprocess.run(
        [sys.executable, __file__, "_memory", str(lines), str(target)],
        env=ENV,
        capture_output=True,
        check=True,
    )
    result: dict[str, float] = json.loads(target.read_text())
    return result


def row(name: str, result: dict[str, float], base: dict[str, float] | None = None) -> str:
    phase_rate = (
        result["tokens"] / result["phase"] if result["phase"] == result["phase"] else float("nan")
    )
    wall_rate = result["tokens"] / result["wall"]
    ratio = ""
    if base is not None:
        ratio = f"{phase_rate / (base['tokens'] / base['phase']):6.2f}x"
    return (
        f"{name:<44} {result['tokens']:>7.0f} {result['phase']:>8.1f} {phase_rate:>9.1f} "
        f"{result['wall']:>8.1f} {wall_rate:>9.1f} {ratio:>7}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--memory-lines", type=int, default=50_000)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (a), (b) and (c) in turn; the best of each is shown (a shared "
        "2-core machine is noisy)",
    )
    args = parser.parse_args()

    from worker.models import ensure_converted

    work = Path(tempfile.mkdtemp(prefix="overnight-bench-"))
    model_dir = ensure_converted(work)
    print(
        f"{'runner':<44} {'tokens':>7} {'batch s':>8} {'tok/s':>9} "
        f"{'wall s':>8} {'wall t/s':>9} {'vs (a)':>7}"
    )
    plain = chats(args.requests, repetitive=False)
    source = input_file(plain, args.max_tokens, work / "plain.jsonl")
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "run_batch": [], "ours": []}
    for _ in range(args.rounds):
        runs["raw"].append(run_raw(model_dir, plain, args.max_tokens, work))
        runs["run_batch"].append(run_vllm_batch(model_dir, source, work))
        runs["ours"].append(run_overnight(model_dir, source, work))
    raw = min(runs["raw"], key=lambda r: r["phase"])
    vllm_batch = min(runs["run_batch"], key=lambda r: r["wall"])
    ours = min(runs["ours"], key=lambda r: r["phase"])
    ours_wall = min(r["wall"] for r in runs["ours"])
    print(row("(a) vLLM LLM.chat", raw, raw), flush=True)
    print(row("(b) vLLM run_batch (wall incl. start)", vllm_batch), flush=True)
    print(row("(c) overnight API + worker", ours, raw), flush=True)
    speed = ours["tokens"] / ours["phase"] / (raw["tokens"] / raw["phase"])
    engine_speed = ours["tokens"] / ours["engine"] / (raw["tokens"] / raw["phase"])
    median_speed = median(r["phase"] for r in runs["raw"]) / median(
        r["phase"] for r in runs["ours"]
    )
    print(
        f"(c)/(a) batch phase, upload to download: {speed:.3f} best vs best, "
        f"{median_speed:.3f} median vs median; first claim to last shard done: "
        f"{engine_speed:.3f}\n"
        f"(b)/(c) wall clock: {vllm_batch['wall'] / ours['phase']:.3f} with overnight running "
        f"(upload to download), {vllm_batch['wall'] / ours_wall:.3f} counting its own start"
    )
    for name, results in runs.items():
        spread = ", ".join(f"{r['phase']:.1f}/{r['wall']:.1f}" for r in results)
        print(f"  every round of {name} (batch phase s / wall s): {spread}")

    repeated = chats(args.requests, repetitive=True)
    source = input_file(repeated, args.max_tokens, work / "repeated.jsonl")
    raw_rep = run_raw(model_dir, repeated, args.max_tokens, work)
    print(row("(a) LLM.chat, shared prefix + 25% duplicates", raw_rep, raw_rep), flush=True)
    plain_rep = run_overnight(model_dir, source, work, "--no-dedup", "--no-prefix-grouping")
    print(row("(c) overnight, no dedup / no grouping", plain_rep, raw_rep), flush=True)
    smart = run_overnight(model_dir, source, work)
    print(row("(c) overnight, dedup + prefix grouping", smart, raw_rep), flush=True)

    if not args.skip_memory:
        mem = run_memory(args.memory_lines, work)
        growth = (mem["peak"] - mem["baseline"]) / 1e6
        print(
            f"worker RSS on {mem['lines']} lines (scripted engine, real reader/writer/DB path): "
            f"baseline {mem['baseline'] / 1e6:.0f} MB, peak {mem['peak'] / 1e6:.0f} MB, "
            f"growth {growth:.0f} MB, {mem['lines'] / mem['seconds']:.0f} lines/s"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_raw":
        raw_llm_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "_memory":
        memory_child(int(sys.argv[2]), sys.argv[3])
    else:
        main()
