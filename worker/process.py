"""Engine processes die with their owner, even when the owner is SIGKILLed.

vLLM starts its `EngineCore` and `Worker` processes with multiprocessing (`spawn` on CPU,
`fork` elsewhere). Without help they outlive a killed worker as orphans holding gigabytes.
Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) fixes that, but it must be
set inside each child: forked children get it from an at-fork hook, spawned children from a
prefix to the `-c` program that multiprocessing runs in them. Both re-arm the hook in the
child, so grandchildren (vLLM's `Worker` under `EngineCore`) are covered too.

The same program ends a spawned child as multiprocessing ends a forked one: once its process
has run (finalizers run, threads joined, streams flushed), `os._exit`. The interpreter's
teardown would otherwise collect the heap of a process that imported vLLM again and again,
2 s of every engine's stop, paid once per process level at every worker stop, model switch
and `run-batch`. The `overnight` command's own process ends the same way (`end_process`).
"""

import atexit
import contextlib
import ctypes
import functools
import multiprocessing.spawn
import os
import signal
import sys
import threading
from typing import Any, NoReturn

_PR_SET_PDEATHSIG = 1
_installed = False


def _set_pdeathsig(parent_pid: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl: then nobody would signal us.
    if os.getppid() != parent_pid:
        os._exit(1)


def _child_prefix() -> str:
    # The log handler too: what a child logs before vLLM configures it has a home then; and
    # the garbage collector's thresholds for the imports to come (worker.python_gc).
    return (
        f"try:\n import worker.process as _p; _p.die_with_parent({os.getpid()})\n"
        " import app.logging as _l; _l.configure_child()\n"
        " import worker.python_gc as _g; _g.tune()\n"
        "except ImportError:\n pass\n"
    )


def _ended_as_forked(program: str) -> str:
    """`program` (multiprocessing's `spawn_main(...)`, which ends in `sys.exit`) ended by
    `exit_as_forked` where the prefix could import it."""
    body = "".join(f" {line}\n" for line in program.splitlines())
    return (
        f"try:\n{body}except SystemExit as _e:\n"
        " if '_p' in globals() and isinstance(_e.code, int): _p.exit_as_forked(_e.code)\n"
        " raise\n"
    )


def _patched_command_line(original: Any) -> Any:
    @functools.wraps(original)
    def get_command_line(**kwds: Any) -> list[str]:
        cmd: list[str] = list(original(**kwds))
        if "-c" in cmd:
            i = cmd.index("-c") + 1
            cmd[i] = _child_prefix() + _ended_as_forked(cmd[i])
        return cmd

    return get_command_line


def install() -> None:
    """Make every process this one starts from now on die when this one dies."""
    global _installed
    if _installed:
        return
    _installed = True

    def after_fork_in_child() -> None:
        _set_pdeathsig(os.getppid())

    os.register_at_fork(after_in_child=after_fork_in_child)
    multiprocessing.spawn.get_command_line = _patched_command_line(
        multiprocessing.spawn.get_command_line
    )


def exit_as_forked(code: int) -> NoReturn:
    """A spawned child's end, as `multiprocessing` ends a forked child after its run (which
    ran its finalizers, joined its threads and flushed its streams): its exit code, without
    the interpreter's teardown."""
    os._exit(code)


def end_process(code: int) -> NoReturn:
    """End the main process as the interpreter would (other non-daemon threads joined, atexit
    handlers run, streams flushed), without its final sweep of the heap."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    # No public call runs the handlers; `tests/test_worker_process.py` pins this one.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can be said there
            stream.flush()
    os._exit(code)


def die_with_parent(parent_pid: int) -> None:
    """Run first in a spawned child: die with `parent_pid`, and pass this on to our children."""
    _set_pdeathsig(parent_pid)
    install()
