"""One naming rule for every command, the model first as in `vllm serve`, offline if bundled."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.config import ServedModel, Settings
from app.endpoints import EMBEDDINGS
from app.offline.runner import FirstLine, served_model
from app.supervisor import children_for
from tests.engine_fixtures import REPO
from worker.cli import parse
from worker.models import SMOLLM2_DIR, source_of


def _settings(tmp_path: Path, models: list[ServedModel] | None = None) -> Settings:
    extra = {"models": models} if models is not None else {}
    return Settings(data_dir=tmp_path, _env_file=None, **extra)  # type: ignore[call-arg]


def _fake_converted(data_dir: Path) -> Path:
    target = data_dir / "models" / SMOLLM2_DIR
    target.mkdir(parents=True)
    (target / ".overnight-converted").write_text("ok\n")
    return target


def test_every_command_names_the_bundled_models_alike(tmp_path: Path) -> None:
    assert source_of("SmolLM2-135M-Instruct") == "bundled:smollm2"
    assert source_of("all-MiniLM-L6-v2") == "bundled:minilm"
    assert source_of("bundled:minilm") == "bundled:minilm"
    assert source_of("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    pinned = [ServedModel(name="qwen", endpoints=[EMBEDDINGS], source="Qwen/Qwen3-Embedding")]
    assert source_of("qwen", pinned) == "Qwen/Qwen3-Embedding"

    # run-batch takes the bundled names as the worker does, whatever the input's `model`.
    chat = FirstLine("/v1/chat/completions", "my-chat")
    assert served_model("SmolLM2-135M-Instruct", chat, []).source == "bundled:smollm2"
    embed = FirstLine("/v1/embeddings", "all-MiniLM-L6-v2")
    assert served_model(None, embed, []).source == "bundled:minilm"
    hub = FirstLine("/v1/chat/completions", "org/model")
    assert served_model(None, hub, []).source == "org/model"


def test_the_model_may_come_first_as_in_vllm_serve(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    converted = _fake_converted(tmp_path)
    args, _ = parse(["SmolLM2-135M-Instruct", "--window", "7", "--max-num-seqs", "4"], settings)
    assert args.model == str(converted) and args.served_model_name == ["SmolLM2-135M-Instruct"]
    assert (args.window, args.max_num_seqs) == (7, 4)
    args, _ = parse(["org/some-model", "--dtype", "bfloat16"], settings)
    assert (args.model, args.dtype) == ("org/some-model", "bfloat16")
    # An option's value is never taken for the model.
    args, _ = parse(["--dtype", "float16"], settings)
    assert args.model == str(converted) and args.dtype == "float16"
    with pytest.raises(SystemExit, match="two models"):
        parse(["org/a", "--model", "org/b"], settings)


def test_online_requests_and_lora_adapters_are_refused_together_on_cpu(tmp_path: Path) -> None:
    # This machine computes on its CPU, where vLLM 0.32's LoRA kernels mix base and adapter
    # requests of one step up: online requests would not be held apart.
    settings = _settings(tmp_path)
    _fake_converted(tmp_path)
    for lora in (["--enable-lora"], ["--lora-dir", str(tmp_path)], ["--lora-repo", "acme/x"]):
        with pytest.raises(SystemExit, match="online-port with LoRA adapters is refused on CPU"):
            parse(["--online-port", "8001", *lora], settings)
        args = parse(lora, settings)[0]
        assert args.online_port is None and args.enable_lora
    assert parse(["--online-port", "8001"], settings)[0].online_port == 8001


def test_log_stats_are_off_unless_asked(tmp_path: Path) -> None:
    _fake_converted(tmp_path)
    assert parse([], _settings(tmp_path))[0].disable_log_stats is True
    assert parse(["--enable-log-stats"], _settings(tmp_path))[0].disable_log_stats is False


def test_only_bundled_models_switch_the_hub_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_converted(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    parse(["org/some-model"], _settings(tmp_path))
    assert os.environ["HF_HUB_OFFLINE"] == "0", "a hub id keeps the user's setting"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    parse(["org/some-model"], _settings(tmp_path))
    assert "HF_HUB_OFFLINE" not in os.environ
    parse(["SmolLM2-135M-Instruct"], _settings(tmp_path))
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_serve_passes_the_users_hub_settings_to_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    for child in children_for(_settings(tmp_path), ["SmolLM2-135M-Instruct"]):
        assert child.env is not None
        assert (child.env["HF_HUB_OFFLINE"], child.env["HF_TOKEN"]) == ("0", "hf_secret")


def test_worker_help_is_quick_and_shows_overnights_options_first() -> None:
    script = (
        "import sys\nfrom app.cli import main\n"
        "try:\n    main(['worker', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('vllm loaded:', 'vllm' in sys.modules, 'torch loaded:', 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("usage: overnight worker [MODEL]")
    # What makes a start slow (seconds of imports) is not loaded: --help answers at once.
    assert "vllm loaded: False torch loaded: False" in out, "--help must not import vLLM"
    assert "--window" in out and "--no-dedup" in out and "--help=all" in out
    assert "default: True" not in out and "default: None" not in out
