"""Which lines share the engine when they name LoRA adapters, with a scripted engine; the
adapters a `--lora-dir` folder serves, as it changes; and those a `--lora-repo` lists. The
real engine's answers are in tests/test_lora.py."""

import asyncio
import itertools
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.engine_fixtures import REPO, child_env
from tests.fake_engine import MODEL, FakeEngine
from tests.hub_mirror import hub_mirror
from tests.test_worker_scheduler import Collector, chat, drain, job
from worker.adapter_repo import RepoAdapter, adapters_in
from worker.adapters import AdapterRule, FolderSource, LoraAdapters, folder_adapters
from worker.engine_results import EngineResult
from worker.scheduler import Scheduler

ADAPTERS = ["a1", "a2", "a3"]


class WatchedEngine(FakeEngine):
    """Records the models in flight each time a request starts."""

    def __init__(self) -> None:
        super().__init__(delay=0.005)
        self.models: Counter[str] = Counter()
        self.together: list[frozenset[str]] = []

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        model = str(body["model"])
        self.models[model] += 1
        self.together.append(frozenset(self.models))
        try:
            return await super().run(endpoint, body, request_id)
        finally:
            self.models[model] -= 1
            if not self.models[model]:
                del self.models[model]


def interleaved(n: int) -> list[dict[str, Any]]:
    """Lines naming the base model and three adapters in turn, as an input file may."""
    models = [MODEL, *ADAPTERS]
    return [chat(f"q{i}", model=models[i % len(models)]) for i in range(n)]


def run_lines(rule: AdapterRule | None, bodies: list[dict[str, Any]]) -> WatchedEngine:
    async def scenario() -> WatchedEngine:
        engine = WatchedEngine()
        scheduler = Scheduler(engine, window=6, lookahead=40, adapters=rule)
        sink = Collector()
        for i, body in enumerate(bodies):
            await scheduler.submit(job(sink, i, body))
        await drain(scheduler, sink, len(bodies))
        assert sorted(j.line for j, _, _ in sink.results) == list(range(len(bodies)))
        return engine

    return asyncio.run(scenario())


def switches(engine: WatchedEngine) -> int:
    """How often the next request sent names another model than the one before."""
    models = [body["model"] for body in engine.bodies()]
    return sum(1 for before, after in itertools.pairwise(models) if before != after)


def test_base_and_adapters_never_share_the_engine_on_cpu() -> None:
    rule = AdapterRule(frozenset({MODEL}), max_loras=2, base_apart=True)
    engine = run_lines(rule, interleaved(120))
    assert len(engine.calls) == 120
    for models in engine.together:
        assert MODEL not in models or models == {MODEL}, models
        assert len(models) <= 2, models
    # Every adapter ran; the pool's lines ran a group at a time, not in input order.
    assert {m for models in engine.together for m in models} == {MODEL, *ADAPTERS}
    mixed = run_lines(None, interleaved(120))
    assert any(MODEL in models and len(models) > 1 for models in mixed.together)
    assert switches(mixed) == 119 and switches(engine) < 119 / 4


def test_base_lines_mix_with_adapters_where_the_kernels_allow_it() -> None:
    rule = AdapterRule(frozenset({MODEL}), max_loras=1, base_apart=False)
    engine = run_lines(rule, interleaved(80))
    assert all(len(models - {MODEL}) <= 1 for models in engine.together)
    assert any(MODEL in models and len(models) == 2 for models in engine.together)


def test_a_line_without_a_model_is_a_base_line() -> None:
    rule = AdapterRule(frozenset({MODEL, "alias"}), max_loras=1, base_apart=True)
    assert rule.adapter_of({}) is None and rule.adapter_of({"model": "alias"}) is None
    assert rule.adapter_of({"model": ["x"]}) is None and rule.adapter_of({"model": "a1"}) == "a1"


def adapter_folder(root: Path, name: str, base: str | None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": 4, "base_model_name_or_path": base}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_serves_the_adapters_of_its_base_model(tmp_path: Path) -> None:
    adapter_folder(tmp_path, "mine", f"/models/{MODEL}")
    adapter_folder(tmp_path, "hub-id", f"HuggingFaceTB/{MODEL}")
    adapter_folder(tmp_path, "unrecorded", None)
    adapter_folder(tmp_path, "other", "meta-llama/Llama-3.2-1B")
    (tmp_path / "no-config").mkdir()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        folder_adapters(tmp_path / "file.txt", [MODEL])
    found = folder_adapters(tmp_path, [MODEL])
    assert [(a.name, a.path) for a in found] == [
        ("hub-id", tmp_path / "hub-id"),
        ("mine", tmp_path / "mine"),
        ("unrecorded", tmp_path / "unrecorded"),
    ]


def test_an_adapter_loads_once_and_a_failed_load_is_remembered(tmp_path: Path) -> None:
    good = adapter_folder(tmp_path, "good", MODEL)
    adapter_folder(tmp_path, "bad", MODEL)
    loads: list[str] = []

    async def load(name: str, path: Path) -> str | None:
        loads.append(name)
        await asyncio.sleep(0.01)
        return None if path == good else "no adapter_model.safetensors"

    async def scenario() -> list[str | None]:
        folder = LoraAdapters([FolderSource(tmp_path, [MODEL])], load, unload_nothing)
        names = ["good", "bad", "good", "bad", MODEL, "unknown", None]
        return list(await asyncio.gather(*(folder.problem(n) for n in names)))

    problems = asyncio.run(scenario())
    assert sorted(loads) == ["bad", "good"]
    bad = f"The LoRA adapter 'bad' cannot be loaded from {tmp_path / 'bad'}: no adapter_model"
    assert problems == [None, f"{bad}.safetensors", None, f"{bad}.safetensors", None, None, None]


async def unload_nothing(name: str) -> None:
    raise AssertionError(f"{name} unloaded")


def test_another_models_adapter_is_warned_about_once_across_rescans(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter_folder(tmp_path, "other-base", "meta-llama/Llama-3.2-1B")
    source = FolderSource(tmp_path, [MODEL])
    for _ in range(3):
        source.scan()
    assert source.found == []
    warned = [r for r in caplog.records if "not served" in r.getMessage()]
    assert len(warned) == 1 and "other-base" in warned[0].getMessage()


def test_a_rescan_follows_folders_added_and_removed(tmp_path: Path) -> None:
    adapter_folder(tmp_path, "first", MODEL).joinpath("adapter_model.safetensors").touch()
    calls: list[str] = []

    async def load(name: str, path: Path) -> str | None:
        calls.append(f"load {name}")
        return None if (path / "adapter_model.safetensors").exists() else "no weights"

    async def unload(name: str) -> None:
        calls.append(f"unload {name}")

    async def scenario() -> None:
        folder = LoraAdapters([FolderSource(tmp_path, [MODEL])], load, unload)
        assert list(folder.adapters) == ["first"] and not await folder.rescan()
        late = adapter_folder(tmp_path, "late", MODEL)
        adapter_folder(tmp_path, "other-base", "meta-llama/Llama-3.2-1B")
        assert await folder.rescan() and sorted(folder.adapters) == ["first", "late"]
        assert await folder.problem("first") is None
        assert "no weights" in str(await folder.problem("late"))
        shutil.rmtree(tmp_path / "first")
        shutil.rmtree(late)
        assert await folder.rescan() and list(folder.adapters) == []
        assert await folder.problem("first") is None and not await folder.rescan()
        # Put back (now whole), a removed adapter is loaded anew: its failure is forgotten.
        adapter_folder(tmp_path, "late", MODEL).joinpath("adapter_model.safetensors").touch()
        assert await folder.rescan() and await folder.problem("late") is None
        # An unreadable folder keeps what it served.
        shutil.rmtree(tmp_path)
        assert not await folder.rescan() and list(folder.adapters) == ["late"]

    asyncio.run(scenario())
    assert calls == ["load first", "load late", "unload first", "load late"]


def test_a_repo_serves_its_root_and_each_folder_holding_an_adapter() -> None:
    files = [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "math/adapter_config.json",
        "math/adapter_model.safetensors",
        "nested/deep/adapter_config.json",
        "nested/deep/adapter_model.safetensors",
        "nested/notes.txt",
        "other/my_adapter_config.json",
    ]
    found = adapters_in("acme/loras", reversed(files))
    assert [(a.name, a.folder, a.files) for a in found] == [
        # The root adapter downloads the root's files only, not the other adapters'.
        ("acme/loras", "", ("README.md", "adapter_config.json", "adapter_model.safetensors")),
        ("acme/loras/math", "math", (files[3], files[4])),
        ("acme/loras/nested/deep", "nested/deep", (files[5], files[6])),
    ]
    assert adapters_in("acme/none", ["README.md", "model.safetensors"]) == []


def test_an_adapter_that_cannot_be_downloaded_fails_its_lines_once(tmp_path: Path) -> None:
    gets: list[str] = []

    class Unreachable(RepoAdapter):
        def local(self) -> Path:
            gets.append(self.name)
            raise OSError("HfHubHTTPError: 503 Service Unavailable")

    class Listed:
        def __init__(self) -> None:
            self.found = [Unreachable("acme/loras", "math", ("math/adapter_config.json",))]

        def scan(self) -> None:
            pass

    async def load(name: str, path: Path) -> str | None:
        raise AssertionError(f"{name} loaded")

    async def scenario() -> list[str | None]:
        served = LoraAdapters([Listed()], load, unload_nothing)
        assert list(served.adapters) == ["acme/loras/math"] and not await served.rescan()
        names = ["acme/loras/math", "acme/loras", "acme/loras/math"]
        return list(await asyncio.gather(*(served.problem(n) for n in names)))

    problems = asyncio.run(scenario())
    assert gets == ["acme/loras/math"]
    assert problems[1] is None and problems[0] == problems[2]
    assert str(problems[0]).startswith("The LoRA adapter 'acme/loras/math' cannot be loaded from ")
    assert str(problems[0]).endswith(
        "/acme/loras/tree/main/math: HfHubHTTPError: 503 Service Unavailable"
    )


# A worker's view of a `--lora-repo`, in a child process: huggingface_hub reads HF_* at import.
_LIST_AND_FETCH = """
import json, sys
from worker.adapter_repo import RepoSource
found = RepoSource(sys.argv[1]).found
fetched = [str(a.local()) for a in found if a.name in sys.argv[2:]]
print(json.dumps({"names": [a.name for a in found], "fetched": fetched}))
"""


def _in_child(env: dict[str, str | None], *argv: str) -> dict[str, list[str]]:
    command = [sys.executable, "-c", _LIST_AND_FETCH, *argv]
    done = subprocess.run(
        command, env=child_env(env), capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_repo_is_listed_from_the_hub_or_offline_from_the_cache(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    adapter_folder(repo, "math", MODEL).joinpath("adapter_model.safetensors").write_text("w")
    adapter_folder(repo, "chat", MODEL)
    hub: dict[str, str | None] = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    with hub_mirror({"acme/loras": repo}) as mirror:
        hub["HF_ENDPOINT"] = mirror.url
        # Offline and not cached: nothing served (a warning says why), the worker goes on.
        assert _in_child(hub, "acme/loras") == {"names": [], "fetched": []}
        online = _in_child({**hub, "HF_HUB_OFFLINE": "0"}, "acme/loras", "acme/loras/math")
        names = ["acme/loras/chat", "acme/loras/math"]
        assert online["names"] == names and mirror.served(".safetensors")
        [fetched] = map(Path, online["fetched"])
        assert fetched.name == "math" and (fetched / "adapter_model.safetensors").read_text() == "w"
        assert not (fetched.parent / "chat").exists(), "only the adapter named is downloaded"
    # Offline, the cached snapshot is listed: the adapters downloaded so far.
    offline = _in_child(hub, "acme/loras", "acme/loras/math")
    assert offline == {"names": ["acme/loras/math"], "fetched": [str(fetched)]}


# The same worker's view over several listings: a line on stdin asks for the next one.
_RELIST = """
import json, sys
from worker.adapter_repo import RepoSource
source = RepoSource(sys.argv[1], relist_seconds=0)
for _ in sys.stdin:
    print(json.dumps(sorted(a.name for a in source.found)), flush=True)
    source.scan()
"""


def test_a_repo_is_listed_again_and_keeps_its_adapters_when_the_hub_is_away(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    adapter_folder(repo, "math", MODEL)
    hub = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    with hub_mirror({"acme/loras": repo}) as mirror:
        command = [sys.executable, "-c", _RELIST, "acme/loras"]
        env = child_env({**hub, "HF_ENDPOINT": mirror.url})
        with subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
        ) as child:
            assert child.stdin is not None and child.stdout is not None

            def listing() -> list[str]:
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("\n")
                child.stdin.flush()
                return list(json.loads(child.stdout.readline()))

            assert listing() == ["acme/loras/math"]
            adapter_folder(repo, "chat", MODEL)  # pushed to the repo after the worker started
            listing()  # the scan after this listing sees it
            assert listing() == ["acme/loras/chat", "acme/loras/math"]
            del mirror.repos["acme/loras"]  # the hub no longer answers for it: 404
            listing()
            assert listing() == ["acme/loras/chat", "acme/loras/math"]
            child.stdin.close()
            assert child.wait(timeout=60) == 0
