"""LoRA adapters per line: which requests may share the engine, and adapters found in a folder.

A line's `model` names the worker's base model or one of its adapters. The scheduler keeps at
most `--max-loras` adapters in flight at once, so vLLM never swaps adapters in and out of its
slots within a step, and runs a pool's lines adapter by adapter instead of in input order.

On CPU it also never runs base-model requests beside adapter requests. vLLM 0.32's CPU LoRA
kernels (`vllm/lora/ops/torch_ops/lora_ops.py`, used by `PunicaWrapperCPU`) select each
token's adapter as `lora_b_weights[index]`, and a base request's index is -1: once an adapter
shares the step, the base request gets the weights of the last adapter slot, and answers as
that adapter does whenever that slot holds one (`LLM.chat` alone shows it, with --max-loras 1).
Steps of base requests only answer right, and the GPU kernels skip index -1: elsewhere base
and adapter requests mix freely.

`--lora-dir DIR`: each sub-folder of DIR holding a PEFT LoRA (`adapter_config.json`) for the
worker's base model is served under the folder's name, announced and loaded into the engine
when a line first names it. The worker rescans DIR at each heartbeat: a folder added later is
served from then on, and one removed is no longer served (unloaded if it was loaded).
`--lora-repo ORG/NAME` serves a Hugging Face repo's adapters the same way (`worker.adapter_repo`).
"""

import asyncio
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("overnight.worker")

ADAPTER_CONFIG = "adapter_config.json"
# A line's error code when the adapter it names cannot be loaded into the engine.
ADAPTER_LOAD_FAILED = "adapter_load_failed"

# Loads an adapter (name, folder) into the engine: None once loaded, else why not.
LoadAdapter = Callable[[str, Path], Awaitable[str | None]]
# Unloads an adapter (by name) from the engine.
UnloadAdapter = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class AdapterRule:
    """Which requests may be in the engine together."""

    base_names: frozenset[str]
    max_loras: int
    # Base requests never share the engine with adapter requests (the CPU bug above).
    base_apart: bool

    def adapter_of(self, body: dict[str, Any]) -> str | None:
        """The adapter a request names; None for the base model (also when it names none)."""
        model = body.get("model")
        if not isinstance(model, str) or not model or model in self.base_names:
            return None
        return model


# What `InFlightAdapters.first_group` answers when no group may run now: not None, which is
# the scheduler's key for requests without a prompt prefix.
NO_GROUP = object()


class InFlightAdapters:
    """The adapters (None: the base model) of the requests in the engine, counted."""

    def __init__(self, rule: AdapterRule) -> None:
        self.rule = rule
        self._running: Counter[str | None] = Counter()

    def admits(self, adapter: str | None) -> bool:
        running = self._running
        if adapter in running or not running:
            return True
        if adapter is None:
            return not self.rule.base_apart
        if self.rule.base_apart and None in running:
            return False
        return len(running) - (None in running) < self.rule.max_loras

    def admits_group(self, key: Hashable) -> bool:
        """Whether a scheduler group (keyed `(adapter, prefix)`) may join those in flight."""
        return isinstance(key, tuple) and self.admits(key[0])

    def first_group(self, keys: Iterable[Hashable], current: Hashable) -> Hashable:
        """The first group that may run now (NO_GROUP if none may), one of the `current` group's
        adapter first: a switch of adapters drains the engine or swaps vLLM's adapter slots."""
        adapter = current[0] if isinstance(current, tuple) else None
        admitted = (key for key in keys if self.admits_group(key))
        first = next(admitted, NO_GROUP)
        if not isinstance(first, tuple) or first[0] == adapter:
            return first
        same = (key for key in admitted if isinstance(key, tuple) and key[0] == adapter)
        return next(same, first)

    def enter(self, adapter: str | None) -> None:
        self._running[adapter] += 1

    def leave(self, adapter: str | None) -> None:
        self._running[adapter] -= 1
        if self._running[adapter] <= 0:
            del self._running[adapter]


class Adapter(Protocol):
    """An adapter a line may name, loaded into the engine on first use."""

    @property
    def name(self) -> str: ...

    @property
    def root(self) -> str:
        """Where it comes from, as `GET /v1/models` shows it."""
        ...

    def local(self) -> Path:
        """Its folder on this machine, fetched first if need be (blocking; OSError if not)."""
        ...


class AdapterSource(Protocol):
    """Where adapters are found: `--lora-dir`'s folder or a `--lora-repo`."""

    @property
    def found(self) -> Sequence[Adapter]:
        """Its adapters as last scanned."""
        ...

    def scan(self) -> None:
        """Scan again (blocking): a source that cannot be read keeps what it found."""
        ...


@dataclass(frozen=True)
class FolderAdapter:
    name: str
    path: Path

    @property
    def root(self) -> str:
        return str(self.path)

    def local(self) -> Path:
        return self.path


def folder_adapters(
    root: Path, base_names: list[str], told: set[Path] | None = None
) -> list[FolderAdapter]:
    """The LoRA adapters of the base model in `root`'s sub-folders, by name.

    An adapter whose recorded base (`base_model_name_or_path`) ends in another name than the
    base model's folder or served names is skipped, as vLLM's own filesystem resolver does,
    with a warning (once for the folders in `told`, which a rescan passes again);
    one that records no base is taken (vLLM checks its shapes when it loads it).
    """
    if not root.is_dir():
        raise ValueError(f"--lora-dir {root}: not a folder")
    bases = {Path(name).name for name in base_names}
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        config = _adapter_config(folder)
        if config is None or (config.get("peft_type") or "LORA") != "LORA":
            continue
        recorded = str(config.get("base_model_name_or_path") or "")
        if recorded and Path(recorded).name not in bases:
            if told is None or folder not in told:
                log.warning("%s: an adapter of %s, not of %s: not served", folder, recorded, bases)
            if told is not None:
                told.add(folder)
            continue
        found.append(FolderAdapter(folder.name, folder))
    return found


def _adapter_config(folder: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


class FolderSource:
    """`--lora-dir`'s sub-folders, scanned again at each heartbeat."""

    def __init__(self, root: Path, base_names: list[str]) -> None:
        self.root, self.base_names = root, base_names
        self._told: set[Path] = set()  # other models' adapters, warned about once
        self.found: list[FolderAdapter] = folder_adapters(root, base_names, self._told)
        self._unreadable: str | None = None

    def scan(self) -> None:
        try:
            self.found = folder_adapters(self.root, self.base_names, self._told)
        except (OSError, ValueError) as exc:
            if str(exc) != self._unreadable:
                log.warning("--lora-dir %s cannot be read, its adapters kept: %s", self.root, exc)
            self._unreadable = str(exc)
            return
        self._unreadable = None


class LoraAdapters:
    """The adapters of `--lora-dir` and `--lora-repo`, each loaded into the engine when a line
    first names it.

    A failed load (or download) is remembered while the adapter stays served: every line
    naming it gets the same error at once instead of retrying a load that costs seconds.
    """

    def __init__(
        self, sources: list[AdapterSource], load: LoadAdapter, unload: UnloadAdapter
    ) -> None:
        self.sources = sources
        self.adapters = self._found()
        self._load, self._unload = load, unload
        self._loaded: set[str] = set()
        self._failed: dict[str, str] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def _found(self) -> dict[str, Adapter]:
        return {adapter.name: adapter for source in self.sources for adapter in source.found}

    async def rescan(self) -> bool:
        """Serve the adapters the sources hold now: whether they changed.

        A removed adapter is unloaded (lines naming it get the engine's unknown-model error),
        and forgotten: put back, it is loaded anew.
        """
        for source in self.sources:
            await asyncio.to_thread(source.scan)
        now = self._found()
        if now == self.adapters:
            return False
        gone = self.adapters.keys() - now.keys()
        added = sorted(now.keys() - self.adapters.keys())
        # An adapter whose files changed (a repo's new commit) is loaded anew when next named.
        changed = {n for n in now.keys() & self.adapters.keys() if now[n] != self.adapters[n]}
        log.info(
            "LoRA adapters added %s, removed %s, changed %s", added, sorted(gone), sorted(changed)
        )
        self.adapters = now
        for name in gone | changed:
            await self._forget(name)
        return True

    async def _forget(self, name: str) -> None:
        async with self._locks[name]:
            self._failed.pop(name, None)
            if name in self._loaded:
                self._loaded.discard(name)
                await self._unload(name)

    async def problem(self, model: object) -> str | None:
        """Why a line naming `model` cannot run; None once its adapter is loaded (or it names
        no adapter of the sources)."""
        if not isinstance(model, str) or model in self._loaded:
            return None
        adapter = self.adapters.get(model)
        if adapter is None:
            return None
        async with self._locks[model]:
            if model not in self._loaded and model not in self._failed:
                await self._try_load(adapter)
        return self._failed.get(model)

    async def _try_load(self, adapter: Adapter) -> None:
        try:
            path = await asyncio.to_thread(adapter.local)
        except OSError as exc:
            error: str | None = str(exc)
        else:
            error = await self._load(adapter.name, path)
        if error is None:
            self._loaded.add(adapter.name)
            return
        message = f"The LoRA adapter '{adapter.name}' cannot be loaded from {adapter.root}: {error}"
        log.warning("%s", message)
        self._failed[adapter.name] = message
