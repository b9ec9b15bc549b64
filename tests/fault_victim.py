"""The victim: a process of its own that runs a write path until the armed point stops it
(`os._exit(FAULT_EXIT)`); it exits 0 if the point was never reached.

Forked from a fork server that has imported the app once (a fresh interpreter spends
seconds on that, for each of the cases), not from the test process: that one holds threads
(the API's transaction pool among them) that a fork would copy as dead but busy, pooled
database connections, an output capture and exit handlers. The server has done nothing but
import, so its children share none of that.
"""

import asyncio
import logging
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path as FsPath

from tests.fault_api import api, send_through_faults
from tests.fault_pipeline import Deployment, drive
from tests.fault_points import Action, FaultPoint, Injector, Path

TIMEOUT_SECONDS = 180.0

_FORK_SERVER = multiprocessing.get_context("forkserver")
_FORK_SERVER.set_forkserver_preload([__name__])


def run_victim(deployment: Deployment, point: FaultPoint, batch_id: str | None) -> tuple[int, str]:
    """Runs the point's path in a process armed to stop there: its exit status (negative: the
    signal that ended it) and what it wrote to stdout and stderr."""
    with tempfile.TemporaryDirectory() as folder:
        output = FsPath(folder) / "output"
        victim = _FORK_SERVER.Process(
            target=_victim, args=(output, deployment, point, batch_id), name="fault-victim"
        )
        victim.start()
        victim.join(TIMEOUT_SECONDS)
        if victim.exitcode is None:
            victim.kill()
            victim.join()
        assert victim.exitcode is not None
        written = output.read_text(errors="replace") if output.exists() else ""
        return victim.exitcode, written


def _victim(
    output: FsPath, deployment: Deployment, point: FaultPoint, batch_id: str | None
) -> None:
    _write_to(output)
    injector = deployment.arm(Injector(point, Action.EXIT))
    storage = deployment.storage(injector)
    if point.site.path is Path.BATCH:
        assert batch_id is not None
        asyncio.run(drive(deployment, storage, batch_id, timeout=60))
        return
    with api(deployment.settings, storage) as client:
        send_through_faults(client, point.site.path)


def _write_to(output: FsPath) -> None:
    """Stdout, stderr and the log to `output`, unbuffered: `os._exit` flushes nothing."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True)
