"""What each runner spends around a cheap request: embeddings, and chat with max_tokens 1.

    .venv/bin/python bench/bench_per_request.py [--requests 2000] [--kinds embed,chat]
        [--runners raw,run_batch,serve,run-batch] [--chat-model ID] [--embed-model ID]

N distinct 10-30-word sentences through raw vLLM (`LLM.embed` / `LLM.chat`, in the dtype
overnight's worker picks), vLLM's `run_batch` (same dtype), `overnight serve` as shipped (through
the API) and `overnight run-batch`, each cold in its own process. Per runner: dtype, batch phase
(run_batch: "Reading batch" to "Writing outputs"; overnight: first shard claimed to last shard
done), inputs/s, CPU per request of its own process (serve: the model's worker) and of its vLLM
engine processes over the phase, and whether its results equal raw's. On a GPU pass Hugging
Face ids (--chat-model, --embed-model): `serve` then serves them through OVERNIGHT_MODELS.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_worker import serve_children, stop  # noqa: E402

EMBED, CHAT = "embed", "chat"
URLS = {EMBED: "/v1/embeddings", CHAT: "/v1/chat/completions"}
BUNDLED = {EMBED: "all-MiniLM-L6-v2", CHAT: "SmolLM2-135M-Instruct"}
# MiniLM's own limit; any chat model's (the prompts are under 60 tokens)
MAX_MODEL_LEN = {EMBED: 256, CHAT: 2048}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
VOCABULARY = (
    "river market evening quiet engine garden winter letter silver morning harbour window "
    "village mountain careful bright orange table shadow kitchen yellow station ancient "
    "forest gentle coffee library thunder painter student island market ladder candle"
)


def sentences(n: int) -> list[str]:
    """Distinct sentences of 10-30 words (the index makes each one unique)."""
    vocabulary, out = VOCABULARY.split(), []
    for i in range(n):
        length = 10 + (i * 11) % 21
        words = [vocabulary[(i * 13 + k * 5) % len(vocabulary)] for k in range(length - 2)]
        out.append(f"Item {i}: " + " ".join(words) + ".")
    return out


def body(kind: str, model: str, text: str) -> dict[str, Any]:
    if kind == EMBED:
        return {"model": model, "input": text}
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "temperature": 0,
    }


def input_file(kind: str, model: str, texts: list[str], path: Path) -> Path:
    with open(path, "wb") as f:
        for i, text in enumerate(texts):
            line = {"custom_id": f"r{i}", "method": "POST", "url": URLS[kind]}
            f.write(orjson.dumps({**line, "body": body(kind, model, text)}) + b"\n")
    return path


@dataclass
class Outcome:
    """One runner on one kind: phase seconds, CPU seconds by process group, answers by index."""

    runner: str
    dtype: str
    phase: float
    cpu: dict[str, float]
    answers: list[Any]
    prompt_tokens: list[int] = field(default_factory=list)


def answers_of(kind: str, output: bytes, n: int) -> tuple[list[Any], list[int]]:
    """Embeddings or generated texts, and prompt tokens, in input order."""
    answers: list[Any] = [None] * n
    prompts = [0] * n
    for raw in output.splitlines():
        line = orjson.loads(raw)
        i = int(line["custom_id"][1:])
        result = line["response"]["body"]
        if kind == EMBED:
            answers[i] = result["data"][0]["embedding"]
        else:
            answers[i] = result["choices"][0]["message"]["content"]
        prompts[i] = result["usage"]["prompt_tokens"]
    return answers, prompts


# -- CPU of a process tree, snapshot at the log lines that start and end the phase --
def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a process (`front end`) and of its descendants (`engine`) so far."""
    totals = {"front end": 0.0, "engine": 0.0}
    try:
        root = psutil.Process(pid)
        processes = [("front end", root)] + [("engine", p) for p in root.children(True)]
    except psutil.NoSuchProcess:
        return totals
    for group, process in processes:
        try:
            times = process.cpu_times()
            totals[group] += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return totals


class PhaseLog:
    """Reads a process's output as it comes; stamps the first `start` and the last `end` line
    with the time and the CPU of a process tree (serve's: the worker's)."""

    def __init__(self, process: subprocess.Popen[bytes], start: str, end: str) -> None:
        self.marks: dict[str, tuple[float, dict[str, float]]] = {}
        self.text: list[str] = []
        self.watch(start, end, process.pid)
        assert process.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def watch(self, start: str, end: str, pid: int) -> None:
        """From now on, the phase between these lines, with the CPU of `pid`'s tree."""
        self.start, self.end, self.pid = re.compile(start), re.compile(end), pid
        self.marks = {}

    def _read(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            self.text.append(line)
            if self.start.search(line) and "start" not in self.marks:
                self.marks["start"] = (time.monotonic(), cpu_seconds(self.pid))
            elif self.end.search(line):
                self.marks["end"] = (time.monotonic(), cpu_seconds(self.pid))

    def phase(self) -> tuple[float, dict[str, float]]:
        (t0, cpu0), (t1, cpu1) = self.marks["start"], self.marks["end"]
        return t1 - t0, {group: cpu1[group] - cpu0[group] for group in cpu0}

    def dtype(self) -> str:
        found = re.findall(r"dtype=torch\.(\w+)", "".join(self.text))
        return found[-1] if found else "?"


def started(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    pipe = subprocess.PIPE
    return subprocess.Popen(command, env=env, stdout=pipe, stderr=subprocess.STDOUT, cwd=REPO)


def raw_child(kind: str, model: str, dtype: str, source: str, target: str) -> None:
    from vllm import LLM, SamplingParams

    texts = json.loads(Path(source).read_text())
    runner = "pooling" if kind == EMBED else "auto"
    llm = LLM(model=model, dtype=dtype, runner=runner, max_model_len=MAX_MODEL_LEN[kind])
    t0, cpu0 = time.monotonic(), cpu_seconds(pid := os.getpid())
    if kind == EMBED:
        outputs = llm.embed(texts, use_tqdm=False)
        answers = [o.outputs.embedding for o in outputs]
    else:
        chats = [[{"role": "user", "content": t}] for t in texts]
        outputs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        answers = [o.outputs[0].text for o in outputs]
    t1, cpu1 = time.monotonic(), cpu_seconds(pid)
    result = {
        "phase": t1 - t0,
        "cpu": {group: cpu1[group] - cpu0[group] for group in cpu0},
        "answers": answers,
        "prompt_tokens": [len(o.prompt_token_ids or []) for o in outputs],
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
    }
    Path(target).write_text(json.dumps(result))


def run_raw(kind: str, model: str, dtype: str, texts: list[str], work: Path) -> Outcome:
    source, target = work / f"raw-{kind}.json", work / f"raw-{kind}.result.json"
    source.write_text(json.dumps(texts))
    command = [sys.executable, __file__, "_raw", kind, model, dtype, str(source), str(target)]
    done = subprocess.run(command, env=ENV, capture_output=True)
    # Only the result counts: vLLM's LLM, left to interpreter exit, sometimes aborts there
    # ("terminate called without an active exception") after the result was written.
    assert target.exists(), done.stderr.decode(errors="replace")[-3000:]
    got = json.loads(target.read_text())
    return Outcome(
        "raw vLLM", got["dtype"], got["phase"], got["cpu"], got["answers"], got["prompt_tokens"]
    )


def finished(process: subprocess.Popen[bytes], log: PhaseLog) -> None:
    code = process.wait()
    log.thread.join(30)
    assert code == 0, "".join(log.text[-40:])


def run_vllm_batch(
    kind: str, model: str, name: str, dtype: str, source: Path, work: Path, n: int
) -> Outcome:
    target = work / f"run_batch-{kind}.jsonl"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source)]
    command += ["-o", str(target), "--model", model, "--served-model-name", name]
    command += ["--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN[kind])]
    if kind == EMBED:
        command += ["--runner", "pooling"]
    process = started(command, {**ENV, "VLLM_LOGGING_LEVEL": "INFO"})
    log = PhaseLog(process, "Reading batch from", "Writing outputs to")
    finished(process, log)
    phase, cpu = log.phase()
    answers, prompts = answers_of(kind, target.read_bytes(), n)
    return Outcome("vLLM run_batch", log.dtype(), phase, cpu, answers, prompts)


OURS_START = r"claimed shard \d+ of "
OURS_END = r"shard \d+ of \S+: done"


def run_offline(kind: str, model: str, source: Path, work: Path, n: int) -> Outcome:
    target = work / f"run-batch-{kind}.jsonl"
    command = [sys.executable, "-m", "app.cli", "run-batch", "-i", str(source), "-o", str(target)]
    command += ["--model", model, "--work-dir", str(work / f"run-batch-{kind}")]
    env = {k: v for k, v in ENV.items() if not k.startswith(("OVERNIGHT_", "VLLM_CPU_KV"))}
    process = started(command, {**env, "OVERNIGHT_LOG_LEVEL": "INFO", "VLLM_LOGGING_LEVEL": "INFO"})
    log = PhaseLog(process, OURS_START, OURS_END)
    finished(process, log)
    phase, cpu = log.phase()
    answers, prompts = answers_of(kind, target.read_bytes(), n)
    return Outcome("overnight run-batch", log.dtype(), phase, cpu, answers, prompts)


def served_models_env(models: dict[str, str]) -> dict[str, str]:
    """OVERNIGHT_MODELS for Hugging Face ids; the bundled models are the shipped default."""
    if models == BUNDLED:
        return {}
    from app.endpoints import GENERATIVE, POOLING

    served = [
        {"name": models[CHAT], "source": models[CHAT], "endpoints": GENERATIVE},
        {"name": models[EMBED], "source": models[EMBED], "endpoints": POOLING},
    ]
    return {"OVERNIGHT_MODELS": json.dumps(served)}


def run_serve(
    kinds: list[str], models: dict[str, str], sources: dict[str, Path], work: Path, n: int
) -> dict[str, Outcome]:
    """`overnight serve` as shipped; one batch per kind through the SDK, after a warm-up."""
    from tests.harness import free_port

    data = Path(tempfile.mkdtemp(prefix="serve-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERNIGHT_", "VLLM_"))}
    env.update(served_models_env(models))
    port = free_port()
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    process = started([*command, "--data-dir", str(data)], env)
    log = PhaseLog(process, "(?!)", "(?!)")
    outcomes = {}
    try:
        while len(re.findall(r"worker \S+ serving ", "".join(log.text))) < 2:
            assert process.poll() is None, "".join(log.text[-40:])
            time.sleep(0.5)
        workers = serve_children(process.pid)
        for kind in kinds:
            worker = workers[f"worker {models[kind]}"]
            warm = input_file(kind, models[kind], sentences(2), work / f"warm-{kind}.jsonl")
            through_api(port, kind, warm)
            log.watch(OURS_START, OURS_END, worker)
            output = through_api(port, kind, sources[kind])
            phase, cpu = log.phase()
            answers, prompts = answers_of(kind, output, n)
            dtype = worker_dtype_in(data, worker)
            outcomes[kind] = Outcome("overnight serve", dtype, phase, cpu, answers, prompts)
    finally:
        stop(process)
    return outcomes


def through_api(port: int, kind: str, source: Path) -> bytes:
    """Upload, create, wait until completed, download the output, as a client does."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=5)
    file_id = client.files.create(
        file=(source.name, source.read_bytes(), "application/jsonl"), purpose="batch"
    ).id
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint=URLS[kind],  # type: ignore[arg-type]
        completion_window="24h",
    )
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    return client.files.content(batch.output_file_id or "").content


def worker_dtype_in(data: Path, pid: int) -> str:
    """The dtype a worker of `serve` reported in its row (the dashboard's worker page)."""
    from sqlalchemy import select

    from app.config import Settings
    from app.db.models import RegisteredWorker
    from app.db.session import session_scope

    settings = Settings(data_dir=data, _env_file=None)  # type: ignore[call-arg]
    with session_scope(settings) as session:
        row = session.scalars(select(RegisteredWorker).where(RegisteredWorker.pid == pid)).first()
        effective = ((row.engine_configuration or {}) if row else {}).get("effective", {})
        return f"{effective.get('dtype', '?')} ({effective.get('dtype_reason', '?')})"


def agreement(kind: str, outcome: Outcome, raw: Outcome) -> str:
    """How far the runner's results are from raw vLLM's."""
    tokens = sum(a == b for a, b in zip(outcome.prompt_tokens, raw.prompt_tokens, strict=True))
    prompts = f"prompt tokens equal {tokens}/{len(raw.prompt_tokens)}"
    if kind == CHAT:
        same = sum(a == b for a, b in zip(outcome.answers, raw.answers, strict=True))
        return f"tokens equal {same}/{len(raw.answers)}, {prompts}"
    import numpy as np

    x, y = np.array(outcome.answers), np.array(raw.answers)
    cosine = (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    return f"min cosine {cosine.min():.6f}, max |diff| {np.abs(x - y).max():.2e}, {prompts}"


def report(kind: str, outcomes: list[Outcome], n: int) -> None:
    raw = next((o for o in outcomes if o.runner == "raw vLLM"), outcomes[0])
    print(f"\n{kind}: {n} requests")
    print(
        f"{'runner':<20} {'dtype':<10} {'phase s':>8} {'inputs/s':>9} {'vs raw':>7} "
        f"{'front-end ms/req':>17} {'engine ms/req':>14}  results vs raw"
    )
    for o in outcomes:
        front, engine = (o.cpu[g] * 1000 / n for g in ("front end", "engine"))
        print(
            f"{o.runner:<20} {o.dtype.split(' ')[0]:<10} {o.phase:>8.2f} {n / o.phase:>9.1f} "
            f"{raw.phase / o.phase:>6.2f}x {front:>17.3f} {engine:>14.3f}  "
            f"{agreement(kind, o, raw)}"
        )
    for o in outcomes:
        print(f"  {o.runner}: dtype {o.dtype}")


def main() -> None:
    from worker.dtype import worker_dtype
    from worker.models import minilm_dir, resolve

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--kinds", default="embed,chat")
    parser.add_argument("--runners", default="raw,run_batch,serve,run-batch")
    parser.add_argument("--chat-model", default=BUNDLED[CHAT])
    parser.add_argument("--embed-model", default=BUNDLED[EMBED])
    args = parser.parse_args()
    kinds, runners, n = args.kinds.split(","), args.runners.split(","), args.requests
    models = {CHAT: args.chat_model, EMBED: args.embed_model}
    work = Path(tempfile.mkdtemp(prefix="overnight-per-request-"))
    texts = sentences(n)
    sources = {k: input_file(k, models[k], texts, work / f"{k}.jsonl") for k in kinds}
    # What vLLM loads for raw and run_batch: the bundled models' folders, else the hub ids.
    loaded = dict(models)
    if models == BUNDLED:
        from worker.models import ensure_converted

        loaded = {CHAT: str(ensure_converted(work)), EMBED: str(minilm_dir())}
    # The rule as the worker applies it, the model's own exception (SmolLM2 on AMX) included.
    choices = {k: worker_dtype(None, resolve(loaded[k], work).amx_dtype) for k in kinds}
    picked = {k: choice.dtype for k, choice in choices.items()}
    for kind, choice in choices.items():
        print(f"worker's dtype rule here for {kind}: {choice}", flush=True)
    results: dict[str, list[Outcome]] = {k: [] for k in kinds}
    for runner in runners:
        if runner == "serve":
            for kind, outcome in run_serve(kinds, models, sources, work, n).items():
                results[kind].append(outcome)
            continue
        for kind in kinds:
            if runner == "raw":
                outcome = run_raw(kind, loaded[kind], picked[kind], texts, work)
            elif runner == "run_batch":
                outcome = run_vllm_batch(
                    kind, loaded[kind], models[kind], picked[kind], sources[kind], work, n
                )
            else:
                outcome = run_offline(kind, models[kind], sources[kind], work, n)
            results[kind].append(outcome)
            print(f"  {outcome.runner} {kind}: {outcome.phase:.2f} s", flush=True)
    for kind in kinds:
        report(kind, results[kind], n)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_raw":
        raw_child(*sys.argv[2:7])
    else:
        main()
