"""What a cold start costs: vLLM's `run_batch` against `overnight run-batch`, on a tiny batch.

    .venv/bin/python bench/bench_engine_start.py [--repeats 3]

Each runner, in turn and `--repeats` times, runs 8 short chats (max_tokens 4) on the bundled
SmolLM2 (in the dtype overnight's worker picks) from a cold process: start, import, load,
answer, shut down; eagerly (`--enforce-eager`), and overnight's also as shipped, compiling
the model (vLLM's default; its compile cache, `VLLM_CACHE_ROOT`, as found, then warm).
Printed per runner: the median wall time and the median CPU seconds of its whole process
tree (the front end and vLLM's engine processes, sampled until each exits), and the ratios
of overnight's to vLLM's and of compiled to eager. Most of a start is importing torch and vLLM
in three processes; what overnight adds or saves around that is the difference.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "SmolLM2-135M-Instruct"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
SIZE = ["--max-model-len", "2048"]
FLAGS = ["--enforce-eager", *SIZE]
COMPILED = "overnight run-batch, compiled"


def chats(path: Path) -> Path:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Say hello to {i}."}],
                "max_tokens": 4,
            },
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def tree_cpu(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds of `command` and every process under it."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    root, seen = psutil.Process(process.pid), {}
    while process.poll() is None:
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for member in members:
            try:
                times = member.cpu_times()
                seen[member.pid] = times.user + times.system
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
    wall = time.monotonic() - started
    assert process.returncode == 0, f"{command[:4]} exited with {process.returncode}"
    return wall, sum(seen.values())


def main() -> None:
    from worker.dtype import worker_dtype
    from worker.models import ensure_converted, resolve

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="overnight-engine-start-"))
    source = chats(work / "chats.jsonl")
    model_dir = ensure_converted(work / "data")
    dtype = worker_dtype(None, resolve(str(model_dir), work).amx_dtype).dtype  # as the worker
    python = sys.executable
    runners = {
        "vLLM run_batch": [
            python, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source), "-o",
            str(work / "vllm.jsonl"), "--model", str(model_dir), "--dtype", dtype,
            "--served-model-name", MODEL, *FLAGS,
        ],
        "overnight run-batch": [
            python, "-m", "app.cli", "run-batch", "-i", str(source), "-o",
            str(work / "overnight.jsonl"), "--model", MODEL, *FLAGS,
        ],
        # As shipped: the engine compiles the model (vLLM's default), its cache warm after
        # the first repeat.
        COMPILED: [
            python, "-m", "app.cli", "run-batch", "-i", str(source), "-o",
            str(work / "compiled.jsonl"), "--model", MODEL, *SIZE,
        ],
    }  # fmt: skip
    env = {**ENV, "OVERNIGHT_DATA_DIR": str(work / "data")}  # the converted SmolLM2
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    for repeat in range(args.repeats):
        for name, command in runners.items():
            shutil.rmtree(work / ".overnight-run-batch", ignore_errors=True)  # no resume
            wall, cpu = tree_cpu(command, work, env)
            measured[name].append((wall, cpu))
            print(f"  {repeat + 1}: {name}: {wall:.1f} s, {cpu:.1f} CPU-s", flush=True)
    print(f"\ncold start and 8 chats on {MODEL} ({dtype}), median of {args.repeats}")
    print(f"{'runner':<30} {'wall s':>7} {'CPU s':>7}")
    medians = {
        name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for name, runs in measured.items()
    }
    for name, (wall, cpu) in medians.items():
        print(f"{name:<30} {wall:>7.1f} {cpu:>7.1f}")
    (vw, vc), (ow, oc) = medians["vLLM run_batch"], medians["overnight run-batch"]
    print(f"overnight / vLLM: wall {ow / vw:.2f}x, CPU {oc / vc:.2f}x")
    (cw, cc), first = medians[COMPILED], measured[COMPILED][0][0]
    print(f"compiled / eager overnight: wall {cw / ow:.2f}x, CPU {cc / oc:.2f}x", end="")
    print(f" (first compiled start, the cache as found: {first:.1f} s)")


if __name__ == "__main__":
    main()
