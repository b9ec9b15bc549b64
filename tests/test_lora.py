"""LoRA adapters per line: a worker started with `--enable-lora --lora-modules name=path` (or
`--lora-dir DIR`, or `--lora-repo ORG/NAME`) lists its adapters in `/v1/models` with their
base, and a batch's lines may name the base model or any of its adapters.

The fast tests write a worker's row as its registry does (no engine); the engine test builds
tiny adapters for the bundled SmolLM2 with `peft` (`--lora-repo`'s repo is served from them
by `tests/hub_mirror.py` on loopback) and runs base and adapter lines in one batch: on vLLM
0.32's CPU backend, base requests that share an engine step with adapter requests are
answered with an adapter's weights, which the worker's scheduling prevents (`worker.adapters`).
Content is not judged, only equality with the same lines run alone.
"""

import shutil
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from app.config import Settings
from app.endpoints import GENERATIVE
from tests.engine_fixtures import (
    MODEL,
    chat_line,
    deployment,
    jsonl,
    results,
    smollm2_args,
    start_batch,
    wait_status,
)
from tests.harness import running_server
from tests.hub_mirror import hub_mirror
from tests.test_served_names import accepted, announce, refusal

ZERO, NOISY = "zero-adapter", "noisy-adapter"
# Adapters of `--lora-dir`: a copy of NOISY, and one whose weights are not a tensor file; and
# another copy of NOISY, put in the folder while the worker runs.
COPY, BROKEN, LATE = "noisy-copy", "broken-adapter", "late-adapter"
# `--lora-repo`: a hub repo (on a loopback mirror) holding NOISY at its root, ZERO in a folder.
REPO = "acme/smol-loras"
REPO_ZERO = f"{REPO}/zero"


def adapter(name: str, root: str = "/adapters/x") -> dict[str, str]:
    return {"name": name, "parent": MODEL, "root": root}


def errors_of(batch: openai.types.Batch) -> list[Any]:
    return (batch.errors.data or []) if batch.errors else []


def batch_model(client: openai.OpenAI, batch_id: str) -> str | None:
    batch = wait_status(client, batch_id, "in_progress", "failed")
    assert batch.status == "in_progress", batch
    return batch.model


# --- fast: workers rows, no engine ------------------------------------------------------------


def test_adapters_are_listed_with_their_base(client: openai.OpenAI, settings: Settings) -> None:
    announce(settings, "smol-1", [MODEL], GENERATIVE, [adapter(ZERO, "/adapters/zero")])
    raw = client.get("/models", cast_to=object)
    assert isinstance(raw, dict)
    by_id = {m["id"]: m for m in raw["data"]}
    assert by_id[ZERO]["parent"] == MODEL and by_id[ZERO]["root"] == "/adapters/zero"
    assert by_id[ZERO]["endpoints"] == GENERATIVE
    assert "parent" not in by_id[MODEL] and "root" not in by_id[MODEL]
    assert client.models.retrieve(ZERO).id == ZERO


def test_base_and_adapter_lines_share_a_batch_of_the_base_model(
    client: openai.OpenAI, settings: Settings
) -> None:
    announce(settings, "smol-1", [MODEL], GENERATIVE, [adapter(ZERO), adapter(NOISY)])
    mixed = [chat_line("a", model=ZERO), chat_line("b"), chat_line("c", model=NOISY)]
    assert batch_model(client, start_batch(client, jsonl(mixed))) == MODEL
    code, message = refusal(client, start_batch(client, jsonl([chat_line("d", model="nope")])))
    assert code == "model_not_found" and "'nope'" in message
    other = [chat_line("e", model=ZERO), chat_line("f", model="all-MiniLM-L6-v2")]
    batch = wait_status(client, start_batch(client, jsonl(other)), "failed", "in_progress")
    assert [(e.code, e.line) for e in errors_of(batch)] == [("mismatched_model", 2)]


def test_pinned_models_keep_their_adapters(settings: Settings) -> None:
    announce(settings, "smol-1", [MODEL], GENERATIVE, [adapter(ZERO)])
    announce(settings, "other-1", ["unlisted"], GENERATIVE, [adapter("stray") | {"parent": "x"}])
    pinned = settings.model_copy(update={"pin_models": True})
    with (
        running_server(pinned) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as sdk,
    ):
        assert [m.id for m in sdk.models.list()] == [MODEL, "all-MiniLM-L6-v2", ZERO]
        assert accepted(sdk, start_batch(sdk, jsonl([chat_line("a", model=ZERO)])))


# --- the real engine: SmolLM2 with adapters built here -----------------------------------------


GREEDY = {"temperature": 0, "max_tokens": 24}
PROMPTS = ["What is the capital of France?", "Name a colour.", "Count to three."]


def finished(client: openai.OpenAI, lines: list[bytes]) -> dict[str, dict[str, Any]]:
    """Every line's response (status_code, body) of a batch run to completion."""
    batch = wait_status(
        client, start_batch(client, jsonl(lines)), "completed", "failed", timeout=600
    )
    assert batch.status == "completed", batch
    return {custom_id: line["response"] for custom_id, line in results(client, batch).items()}


def answers(responses: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """custom_id → (model, text); every line answered 200."""
    found = {}
    for custom_id, response in responses.items():
        assert response["status_code"] == 200, (custom_id, response)
        body = response["body"]
        found[custom_id] = (body["model"], body["choices"][0]["message"]["content"])
    return found


def lines_for(model: str, tag: str) -> list[bytes]:
    return [chat_line(f"{tag}-{i}", p, model, **GREEDY) for i, p in enumerate(PROMPTS)]


def build_adapter(base: Path, target: Path, zero_b: bool, seed: int = 0) -> Path:
    """A rank-4 LoRA on the attention projections, seeded. `zero_b`: peft's own initialisation
    (B = 0, so the adapter changes nothing); else random A and B (a real change)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=zero_b
    )
    get_peft_model(model, config).save_pretrained(str(target))
    return target


def served_soon(client: openai.OpenAI, present: str, absent: str, timeout: float = 30.0) -> None:
    """Wait until `GET /v1/models` lists `present` and not `absent`."""
    deadline = time.monotonic() + timeout
    while {present, absent} & (ids := {m.id for m in client.models.list()}) != {present}:
        assert time.monotonic() < deadline, ids
        time.sleep(0.5)


def lora_folder(noisy: Path, folder: Path) -> Path:
    shutil.copytree(noisy, folder / COPY)
    broken = shutil.copytree(noisy, folder / BROKEN)
    (broken / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    return folder


def hub_repo(noisy: Path, zero: Path, repo: Path) -> Path:
    shutil.copytree(noisy, repo)
    shutil.copytree(zero, repo / "zero")
    return repo


@pytest.mark.engine
@pytest.mark.backends("sqlite")
def test_base_and_adapter_lines_in_one_batch(smollm2: Path, tmp_path: Path, backend: str) -> None:
    zero_dir = build_adapter(smollm2, tmp_path / "zero", zero_b=True)
    noisy_dir = build_adapter(smollm2, tmp_path / "noisy", zero_b=False)
    folder = lora_folder(noisy_dir, tmp_path / "lora-dir")
    modules = ["--lora-modules", f"{ZERO}={zero_dir}", f"{NOISY}={noisy_dir}"]
    # Five adapters over two slots, and the base: the scheduling keeps them apart.
    lora = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", *modules]
    lora += ["--lora-dir", str(folder), "--lora-repo", REPO]
    repo = hub_repo(noisy_dir, zero_dir, tmp_path / "hub-repo")
    # The hub as on a fresh machine: no offline switch, an empty cache.
    hub = {"HF_HUB_OFFLINE": None, "HF_HOME": str(tmp_path / "hf")}
    with (
        hub_mirror({REPO: repo}) as mirror,
        deployment(backend, tmp_path / "deployment") as running,
    ):
        worker = running.start_worker(
            "smol", [*smollm2_args(smollm2), *lora], {**hub, "HF_ENDPOINT": mirror.url}
        )
        worker.wait_ready()
        client = running.client()
        listed = {m.id: m.model_extra or {} for m in client.models.list()}
        assert {ZERO, NOISY, COPY, BROKEN, REPO, REPO_ZERO} <= set(listed)
        assert listed[ZERO]["parent"] == listed[COPY]["parent"] == listed[REPO]["parent"] == MODEL
        assert listed[COPY]["root"] == str(folder / COPY)
        assert listed[REPO_ZERO]["root"] == f"{mirror.url}/{REPO}/tree/main/zero"
        assert not mirror.served(".safetensors"), "listed at start, downloaded on first use"

        base = answers(finished(client, lines_for(MODEL, "base")))
        noisy = answers(finished(client, lines_for(NOISY, "noisy")))
        assert {model for model, _ in base.values()} == {MODEL} and all(base.values())

        # One batch, the models interleaved line by line, as an input file may have them.
        groups = [lines_for(m, m) for m in (MODEL, ZERO, NOISY, COPY)]
        mixed = [line for lines in zip(*groups, strict=True) for line in lines]
        hubbed = chat_line("hub", PROMPTS[0], REPO, **GREEDY)
        responses = finished(client, [*mixed, hubbed, chat_line("broken", "hi", BROKEN, **GREEDY)])
        broken = responses.pop("broken")
        got = answers(responses)
        # The repo's root adapter (NOISY's files), downloaded on first use, answers as NOISY.
        assert got["hub"] == (REPO, noisy["noisy-0"][1])
        # Its own weights only: not those of the repo's other adapter, never named.
        [weights] = mirror.served(".safetensors")
        assert weights.startswith(f"/{REPO}/resolve/") and weights.count("/") == 5, weights
        for i in range(len(PROMPTS)):
            text = base[f"base-{i}"][1]
            # Base lines beside adapter lines answer as the base model alone.
            assert got[f"{MODEL}-{i}"] == (MODEL, text)
            # B = 0: the adapter's delta is exactly zero, so its greedy answers are the base's.
            assert got[f"{ZERO}-{i}"] == (ZERO, text)
            # The same weights, loaded from the folder on first use, answer as NOISY alone.
            assert got[f"{NOISY}-{i}"] == noisy[f"noisy-{i}"]
            assert got[f"{COPY}-{i}"] == (COPY, noisy[f"noisy-{i}"][1])
        assert any(noisy[f"noisy-{i}"][1] != base[f"base-{i}"][1] for i in range(len(PROMPTS)))
        # An adapter that cannot be loaded fails its own lines, not the batch.
        error = broken["body"]["error"]
        assert broken["status_code"] == 400 and error["code"] == "adapter_load_failed"
        assert f"'{BROKEN}'" in error["message"] and error["param"] == "model"

        unknown = [*lines_for(NOISY, "n"), chat_line("not-served", "hi", "no-such-adapter")]
        failed = wait_status(client, start_batch(client, jsonl(unknown)), "failed")
        assert [(e.code, e.line) for e in errors_of(failed)] == [("mismatched_model", 4)]

        # The folder changes while the worker runs: an adapter put in (whole, by a rename) is
        # served, one taken out (COPY, loaded above) is not, within a heartbeat, no restart.
        shutil.copytree(noisy_dir, tmp_path / LATE)
        (tmp_path / LATE).rename(folder / LATE)
        shutil.rmtree(folder / COPY)
        served_soon(client, LATE, COPY)
        late = answers(finished(client, [chat_line("late", PROMPTS[0], LATE, **GREEDY)]))
        assert late["late"] == (LATE, noisy["noisy-0"][1])
        code, message = refusal(client, start_batch(client, jsonl([chat_line("c", "hi", COPY)])))
        assert code == "model_not_found" and f"'{COPY}'" in message
