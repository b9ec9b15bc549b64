"""Where `overnight serve`'s two CPU engines compute, measured: which layout ends work soonest.

    .venv/bin/python bench/bench_core_layout.py [--embeds 3000] [--chats 96] [--chat-tokens 32]

`overnight serve` with both bundled models, started cold once per layout:
- `shipped`: as a newcomer starts it. vLLM's `auto` binds the first engine (SmolLM2) to the
  first core and leaves the last to front ends; serve binds the second (MiniLM) to that last.
- `swapped`: the same rule with the models the other way round (`--models MiniLM,SmolLM2`).
- `floating`: no binding (`VLLM_CPU_OMP_THREADS_BIND=nobind`), one compute thread per engine
  (`OMP_NUM_THREADS=1`): the kernel puts each where a core is free.
For each, three workloads through the SDK after a warm-up: an embeddings batch alone, a chat
batch alone, both at once. Printed: seconds from create to completed per batch, and each
layout's time against `shipped`'s. Embeddings are checked equal across layouts (same dtype).
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_per_request import (  # noqa: E402
    BUNDLED,
    CHAT,
    EMBED,
    URLS,
    PhaseLog,
    answers_of,
    sentences,
    started,
    through_api,
)
from bench.bench_worker import stop  # noqa: E402

LAYOUTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "shipped": ([], {}),
    "swapped": (["--models", f"{BUNDLED[EMBED]},{BUNDLED[CHAT]}"], {}),
    "floating": ([], {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}),
}


def batch_file(kind: str, texts: list[str], chat_tokens: int, path: Path) -> Path:
    with open(path, "wb") as f:
        for i, text in enumerate(texts):
            if kind == EMBED:
                body: dict[str, Any] = {"model": BUNDLED[EMBED], "input": text}
            else:
                messages = [{"role": "user", "content": text}]
                body = {"model": BUNDLED[CHAT], "messages": messages, "temperature": 0}
                body |= {"max_tokens": chat_tokens, "ignore_eos": True}
            line = {"custom_id": f"r{i}", "method": "POST", "url": URLS[kind], "body": body}
            f.write(orjson.dumps(line) + b"\n")
    return path


def timed(port: int, kind: str, source: Path, into: dict[str, Any]) -> None:
    begun = time.monotonic()
    into[kind] = through_api(port, kind, source)
    into[f"{kind} s"] = time.monotonic() - begun


def run_layout(name: str, sources: dict[str, Path], work: Path, chat_dir: Path) -> dict[str, Any]:
    from tests.harness import free_port

    args, extra_env = LAYOUTS[name]
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    # The converted SmolLM2 is reused: its one-off conversion is not the subject.
    (data / "models").mkdir()
    (data / "models" / chat_dir.name).symlink_to(chat_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERNIGHT_", "VLLM_"))}
    env.pop("OMP_NUM_THREADS", None)
    port = free_port()
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args]
    process = started([*command, "--data-dir", str(data)], env | extra_env)
    log = PhaseLog(process, "(?!)", "(?!)")
    found: dict[str, Any] = {}
    try:
        while "ready: 2 workers" not in "".join(log.text):
            assert process.poll() is None, "".join(log.text[-40:])
            time.sleep(0.5)
        for kind in (EMBED, CHAT):
            timed(port, kind, sources[f"warm {kind}"], {})
        for kind in (EMBED, CHAT):
            alone: dict[str, Any] = {}
            timed(port, kind, sources[kind], alone)
            found[f"{kind} alone"] = alone[f"{kind} s"]
            found[f"{kind} answers"] = alone[kind]
        both: dict[str, Any] = {}
        begun = time.monotonic()
        threads = [
            threading.Thread(target=timed, args=(port, kind, sources[kind], both))
            for kind in (EMBED, CHAT)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found["both: embed"], found["both: chat"] = both[f"{EMBED} s"], both[f"{CHAT} s"]
        found["both: all"] = time.monotonic() - begun
    finally:
        stop(process)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--embeds", type=int, default=3000)
    parser.add_argument("--chats", type=int, default=96)
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    texts = sentences(max(options.embeds, options.chats))
    sources = {
        EMBED: batch_file(EMBED, texts[: options.embeds], 0, work / "embed.jsonl"),
        CHAT: batch_file(CHAT, texts[: options.chats], options.chat_tokens, work / "chat.jsonl"),
        f"warm {EMBED}": batch_file(EMBED, texts[:4], 0, work / "warm-embed.jsonl"),
        f"warm {CHAT}": batch_file(CHAT, texts[:2], 4, work / "warm-chat.jsonl"),
    }
    from worker.models import ensure_converted

    chat_dir = ensure_converted(work / "shared")
    layouts = options.layouts.split(",")
    results = {name: run_layout(name, sources, work, chat_dir) for name in layouts}
    cpu = f"{os.cpu_count()} cores"
    print(f"\n{options.embeds} embeddings, {options.chats} chats x {options.chat_tokens} tokens;")
    print(f"seconds from create to completed ({cpu}), and against shipped:")
    measures = ["embed alone", "chat alone", "both: embed", "both: chat", "both: all"]
    print(f"{'layout':10}" + "".join(f"{m:>20}" for m in measures))
    base = results.get("shipped")
    for name, found in results.items():
        cells = []
        for m in measures:
            ratio = f" ({found[m] / base[m]:.2f}x)" if base else ""
            cells.append(f"{found[m]:.1f}{ratio}")
        print(f"{name:10}" + "".join(f"{c:>20}" for c in cells))

    def embeddings(found: dict[str, Any]) -> list[Any]:
        return answers_of(EMBED, found[f"{EMBED} answers"], options.embeds)[0]

    reference = embeddings(next(iter(results.values())))
    for name, found in results.items():
        same = embeddings(found) == reference
        print(f"{name}: embeddings {'equal' if same else 'DIFFER'} to the first layout's")


if __name__ == "__main__":
    main()
