"""What a worker process sent to its engine, recorded from outside the product.

`record_submissions(path, finished)` makes every worker this process starts append
`batch_id line` to `path` as each request goes to the engine, and to `finished` as its
answer comes back (not when it was stopped): its scheduler's engine is wrapped, and the
jobs the scheduler is given name the line behind each request id. Unbuffered, so that the
record survives a SIGKILL right after the request went out.
"""

import os
from typing import Any

import worker.loop
from worker.engine import Engine, EngineResult
from worker.scheduler import Job, Scheduler


class RecordingEngine:
    """The scheduler's engine, writing down the line of each request it is sent."""

    def __init__(self, engine: Engine, fd: int, finished_fd: int) -> None:
        self._engine = engine
        self._fd = fd
        self._finished_fd = finished_fd
        self._jobs: dict[str, Job] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def expect(self, job: Job) -> None:
        self._jobs[job.engine_id] = job

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        job = self._jobs.get(request_id)
        if job is None:
            # A preempted job runs again under a new request id.
            self._jobs = {j.engine_id: j for j in self._jobs.values()}
            job = self._jobs[request_id]
        record = f"{job.batch_id} {job.line}\n".encode()
        os.write(self._fd, record)
        result = await self._engine.run(endpoint, body, request_id)
        if not (job.preempted or job.aborted):  # a stopped run answers too, with nothing
            os.write(self._finished_fd, record)
        return result


def record_submissions(path: str, finished: str) -> None:
    fd = _append_only(path)
    finished_fd = _append_only(finished)

    class RecordingScheduler(Scheduler):
        def __init__(self, engine: Engine, window: int, **options: Any) -> None:
            self.recorder = RecordingEngine(engine, fd, finished_fd)
            super().__init__(self.recorder, window, **options)

        async def submit(self, job: Job) -> None:
            self.recorder.expect(job)
            await super().submit(job)

    setattr(worker.loop, "Scheduler", RecordingScheduler)  # noqa: B010


def _append_only(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
