"""Hugging Face model ids download as under `vllm serve`, from a hub mirror on loopback.

No hub is reachable here: `tests/hub_mirror.py` serves the hub's routes from the bundled
MiniLM's files, so huggingface_hub's real download and cache code runs, with HF_ENDPOINT,
HF_HOME, HF_TOKEN and HF_HUB_OFFLINE as a user would set them.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from app.config import ServedModel
from app.endpoints import EMBEDDINGS
from tests.engine_fixtures import REPO, child_env, deployment, file_lines, jsonl, line, start_batch
from tests.engine_fixtures import wait_status as wait_batch
from tests.hub_mirror import hub_mirror
from worker.models import minilm_dir

HUB_ID = "acme/private-minilm"
TOKEN = "hf_test_token"


def _hub_env(mirror_url: str, hf_home: Path, **extra: str | None) -> dict[str, str | None]:
    # What a user on a fresh machine has: no offline switch, their own cache and token.
    return {"HF_ENDPOINT": mirror_url, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": None, **extra}


@pytest.mark.engine
def test_a_worker_downloads_a_hub_model_into_the_cache_and_serves_it(tmp_path: Path) -> None:
    hf_home = tmp_path / "hf"
    served = ServedModel(name=HUB_ID, endpoints=[EMBEDDINGS], source=HUB_ID)
    with (
        hub_mirror({HUB_ID: minilm_dir()}, tokens={HUB_ID: TOKEN}) as mirror,
        deployment("sqlite", tmp_path / "data", models=[served]) as running,
    ):
        worker = running.start_worker(
            "hub-worker",
            [HUB_ID, "--enforce-eager", "--max-num-seqs", "8"],
            _hub_env(mirror.url, hf_home, HF_TOKEN=TOKEN),
        )
        worker.wait_ready()
        client = running.client()
        body = {"model": HUB_ID, "input": "overnight runs batches"}
        batch_id = start_batch(client, jsonl([line("e1", EMBEDDINGS, body)]), EMBEDDINGS)
        batch = wait_batch(client, batch_id, "completed", "failed", timeout=120)
        assert batch.status == "completed", batch
        [result] = file_lines(client, batch.output_file_id)
        # The mirror serves MiniLM: 384 dimensions. The values themselves are not checked.
        assert len(result["response"]["body"]["data"][0]["embedding"]) == 384

    weights = mirror.served("/model.safetensors")
    assert weights, f"the weights were not downloaded: {mirror.requests}"
    to_repo = {auth for _, path, auth in mirror.requests if HUB_ID in path}
    assert to_repo == {f"Bearer {TOKEN}"}, "HF_TOKEN is sent with every request for the model"
    cached = hf_home / "hub" / "models--acme--private-minilm" / "snapshots"
    assert any(cached.rglob("model.safetensors")), "downloaded into HF_HOME's cache"


def _worker_error(env: dict[str, str | None], model: str, tmp_path: Path) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "worker", model, "--data-dir", str(tmp_path / "data")],
        env=child_env(env),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    return result.returncode, result.stderr.splitlines()


@pytest.mark.parametrize(
    ("token", "offline", "expected"),
    [
        (None, "0", f"model '{HUB_ID}' is neither a local folder nor a model on "),
        (TOKEN, "1", f"model '{HUB_ID}' is not in the Hugging Face cache ("),
    ],
    ids=["private-without-token", "offline-not-cached"],
)
def test_a_model_that_cannot_be_had_is_one_clear_line(
    tmp_path: Path, token: str | None, offline: str, expected: str
) -> None:
    with hub_mirror({HUB_ID: minilm_dir()}, tokens={HUB_ID: TOKEN}) as mirror:
        env = _hub_env(mirror.url, tmp_path / "hf", HF_HUB_OFFLINE=offline)
        if token:
            env["HF_TOKEN"] = token
        code, stderr = _worker_error(env, HUB_ID, tmp_path)
    assert code == 1
    assert stderr[-1].startswith(f"overnight: error: {expected}"), stderr[-20:]
    assert not any("Traceback" in text for text in stderr), "\n".join(stderr)


def test_run_batch_says_in_one_line_that_a_model_cannot_be_had(tmp_path: Path) -> None:
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(jsonl([line("e1", EMBEDDINGS, {"model": HUB_ID, "input": "x"})]))
    command = [sys.executable, "-m", "app.cli", "run-batch", "-i", str(requests)]
    command += ["-o", str(tmp_path / "out.jsonl"), "--work-dir", str(tmp_path / "work")]
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        command, env=child_env(env), capture_output=True, text=True, cwd=REPO, timeout=300
    )
    stderr = result.stderr.splitlines()
    assert result.returncode == 1
    assert stderr[-1].startswith(f"overnight: error: model '{HUB_ID}' is not in the Hugging Face")
    assert not any("Traceback" in text for text in stderr), "\n".join(stderr)
