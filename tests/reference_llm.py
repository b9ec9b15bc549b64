"""vLLM's own offline answers for a list of chats: `python tests/reference_llm.py MODEL IN OUT`.

IN is a JSON list of `{"messages": [...], "max_tokens": int, "stop": [...]}`; OUT gets the
greedy texts in the same order. The worker tests compare their batch outputs with these:
`answers_in_background` computes REFERENCE_CHATS once for a whole test run.
"""

import fcntl
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

REFERENCE_CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16},
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours."},
        ],
        "max_tokens": 24,
    },
    {
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "max_tokens": 24,
        "stop": [","],
    },
    {
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a fact about cats."},
        ],
        "max_tokens": 20,
    },
    {"messages": [{"role": "user", "content": "Write a haiku about rain."}], "max_tokens": 8},
]


def main(model: str, source: str, target: str) -> None:
    from vllm import LLM, SamplingParams

    from worker.dtype import worker_dtype
    from worker.models import SMOLLM2_AMX_DTYPE

    with open(source) as f:
        chats = json.load(f)
    # The dtype the worker picks for the bundled SmolLM2 on this machine: greedy texts are
    # equal only within one dtype.
    dtype = worker_dtype(None, SMOLLM2_AMX_DTYPE).dtype
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=2048)
    params = [
        SamplingParams(temperature=0, max_tokens=c["max_tokens"], stop=c.get("stop")) for c in chats
    ]
    outputs = llm.chat([c["messages"] for c in chats], params, use_tqdm=False)
    with open(target, "w") as f:
        json.dump([o.outputs[0].text for o in outputs], f)


@contextmanager
def answers_in_background(
    model: Path, folder: Path, env: dict[str, str]
) -> Iterator[Callable[[], list[str]]]:
    """REFERENCE_CHATS' answers, computed once into `folder` by whichever test process asks
    first (in a subprocess, while its workers start); calling the function waits for them."""
    folder.mkdir(parents=True, exist_ok=True)
    target, log = folder / "answers.json", folder / "log"

    def read() -> list[str]:
        assert target.exists(), log.read_text()[-3000:]
        texts: list[str] = json.loads(target.read_text())
        return texts

    with open(folder / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process computes them and holds the lock till then

            def waited() -> list[str]:
                # Shared, and let go at once: a lock kept till this process's end made every
                # later process wait for that end (one run's last test file stood 190 s).
                fcntl.flock(lock, fcntl.LOCK_SH)
                try:
                    return read()
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

            yield waited
            return
        if target.exists():  # computed already: the lock is for a computation only
            fcntl.flock(lock, fcntl.LOCK_UN)
            yield read
            return
        source = folder / "in.json"
        source.write_text(json.dumps(REFERENCE_CHATS))
        with open(log, "wb") as out:
            command = [sys.executable, __file__, str(model), str(source), f"{target}.part"]
            process = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).parent.parent,
            )

        def finish() -> None:
            if process.wait() == 0:
                os.replace(f"{target}.part", target)
            fcntl.flock(lock, fcntl.LOCK_UN)

        finisher = threading.Thread(target=finish, daemon=True)
        finisher.start()

        def computed() -> list[str]:
            finisher.join(600)
            return read()

        try:
            yield computed
        finally:
            if process.poll() is None:
                process.kill()
            finisher.join(60)


if __name__ == "__main__":
    main(*sys.argv[1:4])
