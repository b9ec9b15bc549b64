"""One engine slot of a switching worker: the model it holds, switched by sleep or restart.

With `--enable-sleep-mode` on a platform where vLLM has it (CUDA, ROCm, XPU), a model the
worker leaves keeps its engine asleep (`--sleep-level 1` keeps the weights in host memory,
2 drops them and reloads them from disk) and wakes it when held again: vLLM measured this at
18-200x faster than a reload. Elsewhere (CPU) the engine is stopped and the next model's
started. Either way the worker sees one `VllmEngine` at a time.
"""

import logging
from argparse import Namespace
from contextlib import AsyncExitStack
from dataclasses import dataclass

from worker.engine import VllmEngine, start_engine

log = logging.getLogger("overnight.worker")


@dataclass
class _Kept:
    engine: VllmEngine
    stack: AsyncExitStack


class EngineSlot:
    def __init__(self, sleep_level: int | None) -> None:
        """`sleep_level`: vLLM's sleep level for left models, None to stop their engines."""
        self.sleep_level = sleep_level
        self.held: str | None = None
        self._kept: dict[str, _Kept] = {}

    async def hold(self, model: str, args: Namespace) -> VllmEngine:
        """The engine of `model`, awake: the held one, a sleeping one woken, or a new one."""
        if self.held == model:
            return self._kept[model].engine
        await self._leave_held()
        kept = self._kept.get(model)
        if kept is not None:
            log.info("waking %s", model)
            await kept.engine.wake_up()
        else:
            stack = AsyncExitStack()
            engine = await stack.enter_async_context(start_engine(args))
            kept = self._kept[model] = _Kept(engine, stack)
        self.held = model
        return kept.engine

    async def _leave_held(self) -> None:
        if self.held is None:
            return
        model, self.held = self.held, None
        if self.sleep_level is not None:
            log.info("putting %s to sleep (level %d)", model, self.sleep_level)
            await self._kept[model].engine.sleep(self.sleep_level)
            return
        log.info("stopping %s's engine", model)
        await self._kept.pop(model).stack.aclose()

    async def close(self) -> None:
        self.held = None
        while self._kept:
            _, kept = self._kept.popitem()
            await kept.stack.aclose()
