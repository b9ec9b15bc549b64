"""Throughput of overnight against vLLM's own offline paths, and the worker's memory.

    .venv/bin/python bench/bench_worker.py [--requests 512] [--max-tokens 64] [--rounds 3]
        [--dtype float32|bfloat16|auto] [--runners abcde] [--skip-repetition] [--skip-memory]

Same generated input and model (the bundled SmolLM2, converted once) for every runner:
  (a) raw vLLM `LLM.chat`,
  (b) `python -m vllm.entrypoints.openai.run_batch`,
  (c) overnight tuned: `overnight api` + one `overnight worker` with the same engine flags as (a),
  (d) overnight as shipped: `overnight serve` on a fresh data directory, every default as a
      newcomer gets it (both bundled workers, the worker's default dtype, the default model length),
      after a 2-request warm-up batch,
  (e) raw vLLM `LLM.chat` at vLLM's own defaults (a compiled model, the default model length),
      in (d)'s dtype: what `vllm serve` runs, so what (d) runs.
Each round runs (a)-(e) in turn (or those --runners names); best and median rounds are
compared. The dtype and flags of every runner are printed, and every runner's greedy texts
are compared with (a)'s, and (d)'s with (e)'s: the speed ratios only mean something when
they ran the same numbers and made the same tokens, and a compiled model's low-precision
sums can pick another greedy token than an eager one's.
Then a realistic-repetition input (shared system prompt, a quarter exact duplicates) through
(a) and (c) with and without prefix grouping + dedup, and the worker's RSS on a 50,000-line
batch with a scripted engine (a real one at ~800 tokens/s would need an hour for it).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 2048
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
TERMINAL = ("completed", "failed", "expired", "cancelled")
SYSTEM = (
    "You are a careful assistant for a travel company. Answer in one short paragraph, "
    "mention prices in euros, never invent opening hours, and always suggest one nearby "
    "alternative. Keep a friendly, professional tone and avoid lists. "
) * 3


@dataclass
class Result:
    """One runner's run: seconds, generated tokens, greedy texts in input order."""

    runner: str
    flags: str
    dtype: str
    wall: float
    phase: float
    tokens: int
    texts: list[str]
    running: float = float("nan")  # in_progress -> finalizing, as the Batch object shows it
    cpu: dict[str, float] = field(default_factory=dict)  # process -> share of one core

    @property
    def rate(self) -> float:
        return self.tokens / self.phase


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
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(orjson.dumps({**line, "body": body}) + b"\n")
    return path


def texts_of(output: bytes, count: int) -> tuple[list[str], int]:
    """Greedy texts in input order (`r{i}` ids) and the generated tokens of an output file."""
    texts, tokens = [""] * count, 0
    for raw in output.splitlines():
        line = orjson.loads(raw)
        body = line["response"]["body"]
        texts[int(line["custom_id"][1:])] = body["choices"][0]["message"]["content"]
        tokens += body["usage"]["completion_tokens"]
    return texts, tokens


def engine_flags(dtype: str) -> list[str]:
    # Always explicit: a worker left to itself picks float32 on a CPU without bfloat16.
    return ["--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN), "--dtype", dtype]


def logged_dtype(log: str) -> str:
    """The dtype vLLM's engine reports in its configuration line."""
    found = re.findall(r"model='[^']*SmolLM2[^']*'.*?dtype=torch\.(\w+)", log)
    return found[-1] if found else "?"


# -- (a) raw LLM.chat, in a child process so that each runner starts cold --
def raw_engine_args(dtype: str, eager: bool) -> dict[str, Any]:
    """(a)'s `LLM` arguments, or with `eager` off (e)'s: vLLM's defaults but the dtype."""
    if eager:
        return {"dtype": dtype, "enforce_eager": True, "max_model_len": MAX_MODEL_LEN}
    return {"dtype": dtype}


def raw_llm_child(
    model_dir: str, source: str, max_tokens: int, target: str, dtype: str, eager: bool
) -> None:
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=model_dir, **raw_engine_args(dtype, eager))
    ready = time.monotonic()
    messages = json.loads(Path(source).read_text())
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outputs = llm.chat(messages, params, use_tqdm=False)
    done = time.monotonic()
    result = {
        "wall": done - started,
        "phase": done - ready,
        "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "texts": [o.outputs[0].text for o in outputs],
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
    }
    Path(target).write_text(json.dumps(result))


def run_raw(
    model_dir: Path,
    messages: list[Any],
    max_tokens: int,
    work: Path,
    dtype: str,
    eager: bool = True,
) -> Result:
    source, target = work / "raw.json", work / "raw.result.json"
    source.write_text(json.dumps(messages))
    child = [sys.executable, __file__, "_raw", str(model_dir), str(source), str(max_tokens)]
    child += [str(target), dtype, "eager" if eager else "default"]
    subprocess.run(child, env=ENV, capture_output=True, check=True)
    got = json.loads(target.read_text())
    arguments = ", ".join(f"{k}={v!r}" for k, v in raw_engine_args(dtype, eager).items())
    return Result(
        "(a) vLLM LLM.chat" if eager else "(e) vLLM LLM.chat, vLLM's defaults",
        f"LLM({arguments}).chat",
        got["dtype"],
        got["wall"],
        got["phase"],
        got["tokens"],
        texts=got["texts"],
    )


# -- (b) vLLM's run_batch: its batch phase is timed by its own log lines, read as they come --
def run_vllm_batch(model_dir: Path, source: Path, work: Path, dtype: str, count: int) -> Result:
    target = work / "run_batch.out.jsonl"
    flags = [*engine_flags(dtype), "--served-model-name", MODEL]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source)]
    command += ["-o", str(target), "--model", str(model_dir), *flags]
    started = time.monotonic()
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    stamps: dict[str, float] = {}
    log: list[str] = []
    for raw in process.stdout:
        text = raw.decode(errors="replace")
        log.append(text)
        for mark in ("Reading batch from", "Writing outputs to"):
            if mark in text:
                stamps.setdefault(mark, time.monotonic())
    assert process.wait() == 0, "".join(log[-30:])
    wall = time.monotonic() - started
    phase = stamps["Writing outputs to"] - stamps["Reading batch from"]
    texts, tokens = texts_of(target.read_bytes(), count)
    dtype_seen = logged_dtype("".join(log))
    return Result("(b) vLLM run_batch", " ".join(flags), dtype_seen, wall, phase, tokens, texts)


# -- (c) and (d): overnight deployments in subprocesses, driven through the SDK --
class CpuMeter:
    """CPU time of a process and its descendants, grouped by what they are, over a window."""

    def __init__(self, roots: dict[str, int]) -> None:
        import psutil

        self.groups: dict[str, list[Any]] = {}
        for name, pid in roots.items():
            root = psutil.Process(pid)
            self.groups[f"{name} (own process)"] = [root]
            self.groups[f"{name} (its vLLM engine processes)"] = root.children(recursive=True)
        self.started = time.monotonic()
        self.before = self._seconds()

    def _seconds(self) -> dict[str, float]:
        import psutil

        totals = {}
        for name, processes in self.groups.items():
            total = 0.0
            for p in processes:
                try:
                    times = p.cpu_times()
                    total += times.user + times.system
                except psutil.NoSuchProcess:
                    pass
            totals[name] = total
        return totals

    def shares(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        after = self._seconds()
        return {
            name: (after[name] - self.before[name]) / elapsed
            for name in self.groups
            if self.groups[name]
        }


@dataclass
class BatchRun:
    wall_to_download: float
    running: float
    output: bytes
    cpu: dict[str, float]


# As a client polls (each status is seen within this much). At ten polls a second the API
# took 5 % of a core beside the engine, CPU that no client polling at a human pace costs.
POLL_SECONDS = 0.5


def run_batch_through_sdk(port: int, source: Path, roots: dict[str, int]) -> BatchRun:
    """Upload, create, poll until terminal, download; CPU over in_progress."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=5)
    started = time.monotonic()
    file_id = client.files.create(
        file=(source.name, source.read_bytes(), "application/jsonl"), purpose="batch"
    ).id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen: dict[str, float] = {}
    meter: CpuMeter | None = None
    cpu: dict[str, float] = {}
    while batch.status not in TERMINAL:
        time.sleep(POLL_SECONDS)
        batch = client.batches.retrieve(batch.id)
        if batch.status not in seen:
            seen[batch.status] = time.monotonic()
            if batch.status == "in_progress":
                meter = CpuMeter(roots)
            elif meter is not None and batch.status in ("finalizing", "completed"):
                cpu = meter.shares()
    assert batch.status == "completed", batch
    output = client.files.content(batch.output_file_id or "").content
    done = time.monotonic()
    end = seen.get("finalizing", seen["completed"])
    return BatchRun(done - started, end - seen.get("in_progress", started), output, cpu)


READY = re.compile(rb"worker \S+ serving ")


def wait_until_serving(path: Path, workers: int, process: subprocess.Popen[bytes]) -> None:
    """Until the log says `worker … serving …` for this many workers (text or JSON logs)."""
    while len(READY.findall(path.read_bytes())) < workers:
        assert process.poll() is None, path.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def deployment_result(
    name: str, flags: str, log: Path, started: float, run: BatchRun, count: int
) -> Result:
    texts, tokens = texts_of(run.output, count)
    return Result(
        name,
        flags,
        logged_dtype(log.read_text(errors="replace")),
        wall=time.monotonic() - started,
        phase=run.wall_to_download,
        tokens=tokens,
        texts=texts,
        running=run.running,
        cpu=run.cpu,
    )


def run_tuned(
    model_dir: Path, source: Path, work: Path, dtype: str, count: int, *worker_flags: str
) -> Result:
    """(c): `overnight api` + `overnight worker` with (a)'s engine flags."""
    from tests.harness import free_port

    data = Path(tempfile.mkdtemp(prefix="tuned-", dir=work))
    port = free_port()
    env = {**ENV, "OVERNIGHT_DATA_DIR": str(data)}
    log = data / "worker.log"
    started = time.monotonic()
    api = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "api", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    flags = [*engine_flags(dtype), *worker_flags]
    command = [sys.executable, "-m", "app.cli", "worker", "--model", str(model_dir)]
    with open(log, "wb") as log_file:
        worker = subprocess.Popen(
            [*command, "--served-model-name", MODEL, *flags],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        wait_until_serving(log, 1, worker)
        run = run_batch_through_sdk(port, source, {"api": api.pid, "worker": worker.pid})
    finally:
        stop(worker, api)
    name = "(c) overnight tuned: api + worker" + (
        f" {' '.join(worker_flags)}" if worker_flags else ""
    )
    return deployment_result(name, " ".join(flags), log, started, run, count)


def serve_children(pid: int) -> dict[str, int]:
    """`overnight serve`'s children by role: `api`, `worker NAME`."""
    import psutil

    roles = {}
    for child in psutil.Process(pid).children():
        words = child.cmdline()
        role = "api" if "api" in words else f"worker {words[words.index('--model') + 1]}"
        roles[role] = child.pid
    return roles


def run_shipped(model_dir: Path, source: Path, work: Path, count: int) -> Result:
    """(d): `overnight serve` exactly as a newcomer starts it, on a fresh data directory."""
    from tests.harness import free_port

    data = Path(tempfile.mkdtemp(prefix="shipped-", dir=work))
    # The converted model is reused: the first start's one-off conversion is not the subject.
    (data / "models").mkdir()
    (data / "models" / model_dir.name).symlink_to(model_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERNIGHT_", "VLLM_"))}
    env["VLLM_LOGGING_LEVEL"] = "INFO"  # only so that vLLM's line with the dtype is logged
    port = free_port()
    log = data / "serve.log"
    started = time.monotonic()
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    with open(log, "wb") as log_file:
        serve = subprocess.Popen(
            [*command, "--data-dir", str(data)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        wait_until_serving(log, 2, serve)
        warm_up = input_file(chats(2, repetitive=False), 8, work / "warm-up.jsonl")
        run_batch_through_sdk(port, warm_up, {})
        run = run_batch_through_sdk(port, source, serve_children(serve.pid))
    finally:
        stop(serve)
    name = "(d) overnight as shipped: serve"
    return deployment_result(name, "(every default)", log, started, run, count)


# -- memory: the worker loop on 50,000 lines, scripted engine, RSS sampled in the child --
def memory_child(lines: int, target: str) -> None:
    import asyncio

    import psutil
    from sqlalchemy import select

    from app.config import Settings
    from app.db.models import Batch
    from app.db.session import session_scope, upgrade
    from app.schemas.batches import CreateBatchRequest
    from app.services import batches
    from app.services.auth import DEFAULT_PROJECT, ensure_project
    from app.services.steps.validation import validate_pending
    from tests import batch_sim
    from tests.fake_engine import FakeEngine
    from worker.loop import Worker, WorkerOptions

    work = Path(tempfile.mkdtemp(prefix="overnight-mem-"))
    settings = Settings(data_dir=work, shard_lines=1000, _env_file=None)  # type: ignore[call-arg]
    upgrade(settings.sqlalchemy_url)
    file_id = batch_sim.store_input_file(
        settings, (batch_sim.request_line(f"r{i}") + b"\n" for i in range(lines))
    )
    with session_scope(settings) as session:
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


# -- report --
HEADER = (
    f"{'runner':<46} {'dtype':<9} {'tokens':>7} {'batch s':>8} {'tok/s':>8} "
    f"{'running s':>9} {'wall s':>7} {'vs (a)':>7}  same texts as (a)"
)


def same_texts(result: Result, base: Result) -> str:
    same = sum(x == y for x, y in zip(result.texts, base.texts, strict=True))
    return f"{same}/{len(base.texts)}" + ("" if same == len(base.texts) else "  (DIFFER)")


def row(result: Result, base: Result) -> str:
    return (
        f"{result.runner:<46} {result.dtype:<9} {result.tokens:>7} {result.phase:>8.1f} "
        f"{result.rate:>8.1f} {result.running:>9.1f} {result.wall:>7.1f} "
        f"{result.rate / base.rate:>6.3f}x  {same_texts(result, base)}"
    )


def best(results: list[Result]) -> Result:
    return min(results, key=lambda r: r.phase)


def running_of(result: Result) -> float:
    """The batch phase that compares with run_batch's: in_progress → finalizing for ours."""
    return result.phase if result.running != result.running else result.running


def report(runs: dict[str, list[Result]]) -> None:
    keys = [key for key in "abcde" if runs[key]]
    base_key = keys[0]  # (a) when it ran
    raw = best(runs[base_key])
    print(HEADER.replace("vs (a)", f"vs ({base_key})"))
    for key in keys:
        print(row(best(runs[key]), raw), flush=True)
    for key in keys:
        first = runs[key][0]
        print(f"  {first.runner}: flags {first.flags}")
        spread = ", ".join(f"{r.phase:.1f}/{r.running:.1f}/{r.wall:.1f}" for r in runs[key])
        print(f"    every round (batch s / running s / wall s): {spread}")
    for key in "cd":
        for name, share in best(runs[key]).cpu.items() if runs[key] else ():
            print(
                f"  {best(runs[key]).runner} CPU while running: {name} {share * 100:.0f}% of a core"
            )
    raw_median = median(r.phase for r in runs[base_key])
    for key in (k for k in "cd" if runs[k]):
        ours = best(runs[key])
        median_ratio = raw_median / median(r.phase for r in runs[key])
        fastest = min(running_of(r) for r in runs[key])
        typical = median(running_of(r) for r in runs[key])
        print(
            f"{ours.runner} / ({base_key}), batch phase upload to download: "
            f"{ours.rate / raw.rate:.3f} best vs best, {median_ratio:.3f} median vs median; "
            f"in_progress to finalizing {fastest:.1f} s best, {typical:.1f} s median: "
            f"({base_key}) / it {raw.phase / fastest:.3f} best, {raw_median / typical:.3f} median"
        )
        if runs["b"]:
            batch_phases = [r.phase for r in runs["b"]]
            print(
                f"  (b) run_batch's batch phase / its in_progress to finalizing: "
                f"{min(batch_phases) / fastest:.3f} best vs best, "
                f"{median(batch_phases) / typical:.3f} median vs median"
            )
    if runs["d"] and runs["e"]:
        shipped, vllm_default = best(runs["d"]), best(runs["e"])
        print(
            f"{shipped.runner} / (e): {shipped.rate / vllm_default.rate:.3f}x the tokens/s, "
            f"same texts as (e): {same_texts(shipped, vllm_default)}"
        )
    if any(best(runs[k]).dtype != raw.dtype for k in keys):
        print("NOTE: the runners did not all run in the same dtype: their ratios compare dtypes")


def main() -> None:
    from worker.dtype import worker_dtype
    from worker.models import SMOLLM2_AMX_DTYPE

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--memory-lines", type=int, default=50_000)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-repetition", action="store_true")
    shipped_dtype = worker_dtype(None, SMOLLM2_AMX_DTYPE).dtype
    parser.add_argument(
        "--dtype",
        default=shipped_dtype,
        help="dtype of (a), (b) and (c); (d) and (e) run the shipped default whatever this says "
        "(default: the one the shipped worker picks for SmolLM2 here; `auto` is vLLM's)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (a)-(e) in turn; best and median shown (a shared 2-core machine is noisy)",
    )
    parser.add_argument(
        "--runners",
        default="abcde",
        help="which of (a)-(e) to run, e.g. `bd` for run_batch against the shipped default",
    )
    args = parser.parse_args()

    from worker.models import ensure_converted

    work = Path(tempfile.mkdtemp(prefix="overnight-bench-"))
    model_dir = ensure_converted(work)
    n = args.requests
    plain = chats(n, repetitive=False)
    source = input_file(plain, args.max_tokens, work / "plain.jsonl")
    runs: dict[str, list[Result]] = {key: [] for key in "abcde"}
    runners = {
        "a": lambda: run_raw(model_dir, plain, args.max_tokens, work, args.dtype),
        "b": lambda: run_vllm_batch(model_dir, source, work, args.dtype, n),
        "c": lambda: run_tuned(model_dir, source, work, args.dtype, n),
        "d": lambda: run_shipped(model_dir, source, work, n),
        "e": lambda: run_raw(model_dir, plain, args.max_tokens, work, shipped_dtype, eager=False),
    }
    for _ in range(args.rounds):
        for key in args.runners:
            runs[key].append(runners[key]())
            print(
                f"  {runs[key][-1].runner}: {runs[key][-1].phase:.1f} s batch phase, "
                f"{running_of(runs[key][-1]):.1f} s running",
                flush=True,
            )
    report(runs)

    if not args.skip_repetition:
        repeated = chats(n, repetitive=True)
        source = input_file(repeated, args.max_tokens, work / "repeated.jsonl")
        raw_rep = run_raw(model_dir, repeated, args.max_tokens, work, args.dtype)
        raw_rep.runner = "(a) LLM.chat, shared prefix + 25% duplicates"
        print(HEADER)
        print(row(raw_rep, raw_rep), flush=True)
        flags = ("--no-dedup", "--no-prefix-grouping")
        print(row(run_tuned(model_dir, source, work, args.dtype, n, *flags), raw_rep), flush=True)
        print(row(run_tuned(model_dir, source, work, args.dtype, n), raw_rep), flush=True)

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
        source, tokens, target, dtype, mode = sys.argv[3], int(sys.argv[4]), *sys.argv[5:8]
        raw_llm_child(sys.argv[2], source, tokens, target, dtype, mode == "eager")
    elif len(sys.argv) > 1 and sys.argv[1] == "_memory":
        memory_child(int(sys.argv[2]), sys.argv[3])
    else:
        main()
