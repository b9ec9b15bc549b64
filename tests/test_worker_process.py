"""Engine processes die with a SIGKILLed owner; the worker command line passes vLLM's flags."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from app.config import Settings
from worker import models, python_gc
from worker.cli import parse
from worker.dtype import worker_dtype

OWNER = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    import worker.process

    def grandchild():
        time.sleep(600)

    def child():
        p = multiprocessing.get_context("spawn").Process(target=grandchild)
        p.start()
        time.sleep(600)

    if __name__ == "__main__":
        worker.process.install()
        method = sys.argv[1]
        multiprocessing.get_context(method).Process(target=child).start()
        time.sleep(600)
    """
)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_children_and_grandchildren_die_with_a_sigkilled_owner(tmp_path: Path, method: str) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), method], cwd=Path(__file__).parent.parent
    )
    try:
        deadline = time.monotonic() + 30
        while len(descendants := psutil.Process(owner.pid).children(recursive=True)) < 2:
            assert time.monotonic() < deadline, "the owner did not start its processes"
            time.sleep(0.1)
        # The spawn machinery may add a resource tracker: only our two matter.
        ours = [p for p in descendants if "resource_tracker" not in " ".join(p.cmdline())]
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        _, alive = psutil.wait_procs(ours, timeout=10)
        assert not alive, f"orphans: {[p.pid for p in alive]}"
    finally:
        if owner.poll() is None:
            owner.kill()


def _fake_converted(data_dir: Path) -> Path:
    target = data_dir / "models" / models.SMOLLM2_DIR
    target.mkdir(parents=True)
    (target / ".overnight-converted").write_text("ok\n")
    return target


THRESHOLDS_SEEN = textwrap.dedent(
    """
    import gc, multiprocessing, sys
    import worker.process

    def child(queue):
        queue.put(gc.get_threshold())

    if __name__ == "__main__":
        worker.process.install()
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print(queue.get(timeout=60))
        process.join()
    """
)


def test_engine_processes_collect_garbage_at_the_tuned_thresholds(tmp_path: Path) -> None:
    """vLLM spawns its engine processes: the collector's thresholds reach them before the
    imports of torch and vLLM, whose objects would otherwise be walked again and again."""
    script = tmp_path / "owner.py"
    script.write_text(THRESHOLDS_SEEN)
    seen = subprocess.run(
        [sys.executable, str(script)],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == str(python_gc.THRESHOLDS)
    assert python_gc.THRESHOLDS != (700, 10, 10)  # CPython's own


LEFT_AT_EXIT = textwrap.dedent(
    """
    import multiprocessing, sys
    import worker.process

    class Cycle:
        def __del__(self):
            with open(sys.argv[1], "a") as seen:
                seen.write("collected\\n")

    def child():
        cycle = Cycle()
        cycle.itself = cycle  # garbage from here on, for the collector to find
        sys.exit(3)

    if __name__ == "__main__":
        worker.process.install()
        process = multiprocessing.get_context("spawn").Process(target=child)
        process.start()
        process.join()
        print(process.exitcode)
    """
)


def _run_program(tmp_path: Path, program: str, seen: Path) -> "subprocess.CompletedProcess[str]":
    """`program` as a script in the repository's folder, told where to write what it sees."""
    script = tmp_path / "program.py"
    script.write_text(program)
    return subprocess.run(
        [sys.executable, str(script), str(seen)],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("installed", [True, False])
def test_engine_processes_end_as_forked_ones_without_the_interpreters_teardown(
    tmp_path: Path, installed: bool
) -> None:
    """CPython's teardown collects the heap again (2 s after importing vLLM); a spawned
    engine process ends as a forked one does, after its run: its exit code kept, the cycles
    it left never collected (their finalizer never runs)."""
    program = LEFT_AT_EXIT if installed else LEFT_AT_EXIT.replace("worker.process.install()", "")
    seen = tmp_path / "seen.txt"
    ran = _run_program(tmp_path, program, seen)
    assert ran.returncode == 0 and ran.stdout.strip() == "3", ran.stderr
    # Without it, CPython's teardown collects the cycle (the test's check that it would).
    assert seen.exists() is not installed


ENDED_BY_THE_COMMAND = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    import app.cli

    class Witness:
        \"\"\"Deleted by the interpreter's teardown, which clears every module's globals.\"\"\"

        def __init__(self, path):
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self.write = os.write  # still at hand when the teardown has cleared `os`

        def say(self, what):
            self.write(self.fd, what.encode() + b"\\n")

        def __del__(self):
            self.say("torn down")

    witness = Witness(sys.argv[1])

    def late_thread():
        time.sleep(0.3)
        witness.say("thread")

    @atexit.register
    def handler():
        witness.say("atexit")

    def main():
        threading.Thread(target=late_thread).start()
        sys.stdout.write("buffered, not flushed")
        return 3

    app.cli.main = main  # the command's work
    app.cli.run()
    """
)


def test_the_command_ends_as_the_interpreter_would_without_its_teardown(tmp_path: Path) -> None:
    """`overnight` (every command) ends with its code, its other threads joined, its atexit
    handlers run (`atexit._run_exitfuncs`, pinned here) and its output flushed; the
    interpreter's teardown (its sweep of the heap: 2 s after vLLM's imports) never runs."""
    seen = tmp_path / "seen.txt"
    ran = _run_program(tmp_path, ENDED_BY_THE_COMMAND, seen)
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout == "buffered, not flushed"
    assert seen.read_text().splitlines() == ["thread", "atexit"]  # never "torn down"


def test_a_running_engine_is_frozen_out_of_collections_until_it_stops() -> None:
    engine = [object() for _ in range(1000)]
    before = gc.get_freeze_count()
    with python_gc.frozen_while_running():
        assert gc.get_freeze_count() >= before + len(engine)
    assert gc.get_freeze_count() == 0  # a stopped engine's cycles can be collected


def test_served_names_resolve_to_bundled_models(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    converted = _fake_converted(tmp_path)

    args, _ = parse(["--model", "SmolLM2-135M-Instruct"], settings)
    assert args.model == str(converted) and args.served_model_name == ["SmolLM2-135M-Instruct"]
    args, _ = parse(["--model", "all-MiniLM-L6-v2"], settings)
    assert args.served_model_name == ["all-MiniLM-L6-v2"] and args.runner == "pooling"
    assert Path(args.model, "config.json").exists()

    args, _ = parse([], settings)
    assert args.model == str(converted), "the bundled SmolLM2 is the default"


def test_the_worker_takes_the_dtype_rules_pick_for_every_name_of_a_model(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    converted = _fake_converted(tmp_path)
    # Each CPU kind's pick is tested in tests/test_dtype.py; here, that parse applies it.
    smollm2 = worker_dtype(None, models.SMOLLM2_AMX_DTYPE)
    # Its served name, its bundled name and its converted folder by path are the same model.
    for model in ("SmolLM2-135M-Instruct", "bundled:smollm2", str(converted)):
        args, _ = parse(["--model", model], settings)
        assert (args.dtype, args.dtype_reason) == (smollm2.dtype, smollm2.reason), model
    args, _ = parse(["--model", "all-MiniLM-L6-v2"], settings)
    here = worker_dtype(None)
    assert (args.dtype, args.dtype_reason) == (here.dtype, here.reason), "other models"
    args, _ = parse(["--model", "bundled:smollm2", "--dtype", "float16"], settings)
    assert (args.dtype, args.dtype_reason) == ("float16", "given with --dtype")


def test_every_vllm_engine_argument_passes_through(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    args, _ = parse(
        [
            "--model", "org/some-model", "--served-model-name", "mine",
            "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5",
            "--max-model-len", "4096", "--dtype", "bfloat16", "--max-num-seqs", "64",
            "--window", "300", "--no-dedup",
        ],
        settings,
    )  # fmt: skip
    assert args.model == "org/some-model" and args.served_model_name == ["mine"]
    assert (args.tensor_parallel_size, args.gpu_memory_utilization) == (2, 0.5)
    assert (args.max_model_len, args.dtype, args.max_num_seqs) == (4096, "bfloat16", 64)
    assert (args.window, args.dedup, args.prefix_grouping) == (300, False, True)


def test_unknown_bundled_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(models.ModelNotFoundError, match="bundled:smollm2"):
        models.resolve("bundled:nope", tmp_path)


@pytest.mark.parametrize(
    ("chosen", "flags", "reserved"),
    [
        (None, [], "2"),
        ("", [], "2"),  # compose passes an unset variable on as empty
        ("7", [], "7"),
        # vLLM's CPU platform lets the variable override the flag: with the flag, it stays unset.
        (None, ["--kv-cache-memory-bytes", "1G"], None),
    ],
)
def test_the_worker_reserves_a_fixed_cpu_kv_cache_unless_told(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chosen: str | None,
    flags: list[str],
    reserved: str | None,
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")  # whatever parse sets is undone after
    if chosen is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", chosen)
    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    args, _ = parse(["--model", "org/some-model", *flags], settings)
    assert os.environ.get("VLLM_CPU_KVCACHE_SPACE") == reserved
    assert args.kv_cache_memory_bytes == (2**30 if flags else None)


def test_online_backoff_flags_and_the_cpu_default(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from worker.backoff import BackoffPolicy
    from worker.cli import CPU_BUSY_WINDOW, _backoff

    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    engine = SimpleNamespace(max_num_seqs=256)
    args, _ = parse(["--model", "org/some-model", "--online-port", "0"], settings)
    assert _backoff(args, engine) == BackoffPolicy(CPU_BUSY_WINDOW, 1.0, 5.0, 0.5)  # this is a CPU
    args, _ = parse(
        [
            "--model", "org/some-model", "--online-port", "0", "--online-busy-window", "10",
            "--online-quiet-seconds", "2", "--online-quiet-gaps", "3",
            "--online-regrow-seconds", "0",
        ],
        settings,
    )  # fmt: skip
    assert _backoff(args, engine) == BackoffPolicy(10, 2.0, 3.0, 0.0)
