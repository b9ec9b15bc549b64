"""Python's garbage collector in the processes that run vLLM: the worker or `run-batch`, and
the engine processes vLLM starts under it.

Importing torch and vLLM and starting an engine create millions of objects that live as long
as the process. At CPython's default thresholds (a collection every 700 new objects) the
cyclic collector walks them again and again: a third of an engine start's CPU on a 2-core
EPYC (perf). Collecting every 50,000 new objects (the older generations at their usual
ratios) takes an engine start about 10% less CPU there (`bench/bench_engine_start.py`).

Once the engine runs, what it created is frozen out of collections, as `vllm serve` does
after its start: a collection in the hot loop then walks only what serving allocated since.
Unfrozen when the engine stops, so that a stopped engine's cycles can be collected (a
switching worker starts another; `run-batch` collects before it exits).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (50_000, 10, 10)


def tune() -> None:
    """The thresholds for a process that imports vLLM (run first, before the imports)."""
    gc.set_threshold(*THRESHOLDS)


@contextmanager
def frozen_while_running() -> Iterator[None]:
    """Everything alive now (a started engine) stays out of collections until the block ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
