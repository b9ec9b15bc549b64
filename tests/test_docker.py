"""The Docker files: parsed here (no Docker engine on this machine), built elsewhere.

They must install with the README's installer (docker/install.sh), and compose must run
PostgreSQL, the API and scalable workers on one shared data volume; `compose.gpu.yaml`
and `compose.s3.yaml` are merged over it as `docker compose -f … -f …` merges them.
"""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


@pytest.mark.parametrize(
    ("name", "flavour", "base"),
    [("Dockerfile", "cuda", "nvidia/cuda:"), ("Dockerfile.cpu", "cpu", "python:3.11")],
)
def test_dockerfiles_use_the_readme_installer(name: str, flavour: str, base: str) -> None:
    steps = instructions(DOCKER / name)
    assert steps[0][0] == "FROM" and steps[0][1].startswith(base)
    runs = [args for word, args in steps if word == "RUN"]
    assert f"OVERNIGHT_FLAVOUR={flavour} bash docker/install.sh" in runs
    assert ("COPY", ". .") in steps
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "/opt/overnight/.venv/bin" in env and "OVERNIGHT_DATA_DIR=/data" in env
    assert ("EXPOSE", "8000") in steps
    assert steps[-1] == ("CMD", '["overnight", "serve"]')
    # The installer the images run is the README's.
    readme = (ROOT / "README.md").read_text()
    assert "bash docker/install.sh && .venv/bin/overnight serve" in readme
    assert (DOCKER / "install.sh").exists()


@pytest.mark.parametrize(("name", "flavour"), [("Dockerfile", "cuda"), ("Dockerfile.cpu", "cpu")])
def test_a_code_edit_does_not_reinstall_the_dependencies(name: str, flavour: str) -> None:
    steps = instructions(DOCKER / name)
    deps = steps.index(("RUN", f"OVERNIGHT_FLAVOUR={flavour} bash docker/install.sh --deps-only"))
    code = steps.index(("COPY", ". ."))
    copied = [args.split()[0] for word, args in steps[:deps] if word == "COPY"]
    assert deps < code and set(copied) == {"pyproject.toml", "docker/install.sh"}


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_images_run_as_a_user_with_a_hub_cache_and_a_readiness_check(name: str) -> None:
    steps = instructions(DOCKER / name)
    users = [args for word, args in steps if word == "USER"]
    assert users == ["overnight"], "one non-root user, set before the service starts"
    assert steps.index(("USER", "overnight")) < len(steps) - 1
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "HF_HOME=/cache/huggingface" in env
    assert "HF_HUB_OFFLINE" not in env, "Hugging Face ids must be able to download"
    assert ("VOLUME", '["/data", "/cache/huggingface"]') in steps
    [check] = [args for word, args in steps if word == "HEALTHCHECK"]
    assert f"http://127.0.0.1:8000{HEALTH_PATH}" in check
    if name == "Dockerfile.cpu":
        # The worker reserves the KV cache itself; the variable would override its flag.
        assert "VLLM_CPU_KVCACHE_SPACE" not in env
        # vLLM compiles the model by default; on CPU torch.compile needs a C++ compiler.
        packages = " ".join(args for word, args in steps if word == "RUN" and "apt-get" in args)
        assert " g++ " in packages


def test_the_build_context_leaves_local_state_and_secrets_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "data", ".git", "test-artifacts", "docker/.env"} <= set(ignored)
    assert "docker/.env" in (ROOT / ".gitignore").read_text().split()


def compose(*names: str) -> dict[str, Any]:
    """The files merged as `docker compose -f … -f …` merges them (mappings key by key)."""

    def merge(base: Any, override: Any) -> Any:
        if isinstance(base, dict) and isinstance(override, dict):
            return {k: merge(base.get(k), v) for k, v in override.items()} | {
                k: v for k, v in base.items() if k not in override
            }
        return override

    merged: dict[str, Any] = {}
    for name in names:
        merged = merge(merged, yaml.safe_load((DOCKER / name).read_text()))
    return merged


HEALTH_PATH = "/readyz"
WORKERS = ("worker", "embedder")


def test_compose_runs_postgres_api_and_workers_on_one_volume() -> None:
    services = compose("compose.yaml")["services"]
    assert set(services) == {"postgres", "api", "worker", "embedder"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["api"]["command"][:2] == ["overnight", "api"]
    assert services["worker"]["command"] == ["overnight", "worker", "SmolLM2-135M-Instruct"]
    assert services["embedder"]["command"][-1] == "all-MiniLM-L6-v2"
    assert "replicas" in services["worker"]["deploy"]
    for name in ("api", *WORKERS):
        service = services[name]
        assert service["volumes"] == ["data:/data", "hf-cache:/cache/huggingface"], name
        env = service["environment"]
        assert env["OVERNIGHT_DATABASE_URL"].startswith("postgresql+psycopg://"), name
        assert "@postgres:5432/" in env["OVERNIGHT_DATABASE_URL"]
        assert env["OVERNIGHT_DATA_DIR"] == "/data"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "${VLLM_CPU_KVCACHE_SPACE:-}"
        assert "HF_HUB_OFFLINE" not in env and env["HF_TOKEN"] == "${HF_TOKEN:-}"
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile.cpu"}
        assert service["image"] == "overnight:cpu"
    assert services["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert compose("compose.yaml")["volumes"].keys() == {"data", "pgdata", "hf-cache"}


def test_compose_has_no_password_of_its_own() -> None:
    services = compose("compose.yaml")["services"]
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${POSTGRES_PASSWORD:?")
    assert ":${POSTGRES_PASSWORD:?" in services["api"]["environment"]["OVERNIGHT_DATABASE_URL"]
    # Every variable the compose files read is in the example settings file.
    used = set()
    for name in ("compose.yaml", "compose.gpu.yaml", "compose.s3.yaml"):
        used |= set(re.findall(r"\$\{([A-Z_]+)", (DOCKER / name).read_text()))
    example = (DOCKER / ".env.example").read_text()
    documented = set(re.findall(r"^([A-Z_]+)=", example, re.MULTILINE))
    assert used == documented
    assert re.search(r"^POSTGRES_PASSWORD=$", example, re.MULTILINE), "no default password"


def test_one_health_check_endpoint_and_none_for_workers() -> None:
    services = compose("compose.yaml")["services"]
    assert services["api"]["healthcheck"]["test"][-1] == f"http://127.0.0.1:8000{HEALTH_PATH}"
    for name in WORKERS:
        assert services[name]["healthcheck"] == {"disable": True}, "workers have no HTTP port"


def test_workers_stop_only_after_their_drain() -> None:
    drain = Settings.model_fields["worker_drain_seconds"].default
    for name in WORKERS:
        service = compose("compose.yaml")["services"][name]
        assert service["environment"]["OVERNIGHT_WORKER_DRAIN_SECONDS"] == (
            f"${{OVERNIGHT_WORKER_DRAIN_SECONDS:-{drain:g}}}"
        )
        grace = int(service["stop_grace_period"].removesuffix("s"))
        assert grace >= drain + 20, "the drain and the engine's shutdown fit in the grace period"


def test_the_gpu_file_builds_and_tags_the_cuda_image_and_reserves_gpus() -> None:
    services = compose("compose.yaml", "compose.gpu.yaml")["services"]
    for name in ("api", *WORKERS):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
        assert services[name]["image"] == "overnight:cuda", "never the CUDA build as :cpu"
    for name in WORKERS:
        [device] = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert "replicas" in services["worker"]["deploy"], "--scale still works"
    # One image per Dockerfile: the tag follows the file, not a second variable.
    for files in (("compose.yaml",), ("compose.yaml", "compose.gpu.yaml")):
        for service in compose(*files)["services"].values():
            if "build" in service:
                flavour = "cpu" if service["build"]["dockerfile"].endswith(".cpu") else "cuda"
                assert service["image"] == f"overnight:{flavour}"


def test_the_s3_file_adds_minio_and_points_every_service_at_its_bucket() -> None:
    merged = compose("compose.yaml", "compose.s3.yaml")
    services = merged["services"]
    assert services["minio"]["image"].startswith("minio/minio:")
    assert "mc mb --ignore-existing local/overnight" in services["bucket"]["entrypoint"][-1]
    for name in ("api", *WORKERS):
        env = services[name]["environment"]
        assert env["OVERNIGHT_STORAGE_URL"] == "s3://overnight"
        assert env["OVERNIGHT_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_SECRET_ACCESS_KEY"].startswith("${MINIO_ROOT_PASSWORD")
        assert env["OVERNIGHT_DATABASE_URL"].startswith("postgresql+psycopg://"), "kept"
        condition = services[name]["depends_on"]["bucket"]["condition"]
        assert condition == "service_completed_successfully"
    assert "minio" in merged["volumes"]


def _compose_cli() -> list[str] | None:
    """Compose v2 (the Compose Specification); the legacy v1 `docker-compose` cannot read it."""
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    return None


def test_compose_config_resolves_offline() -> None:
    """`docker compose config` needs only the client; skipped where there is none."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose client on this machine")
    env = {
        "OVERNIGHT_ADMIN_KEY": "sk-test",
        "POSTGRES_PASSWORD": "pw",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }
    result = subprocess.run(
        [*cli, "-f", str(DOCKER / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["services"]["api"]["environment"]["OVERNIGHT_ADMIN_KEY"] == "sk-test"
    missing = subprocess.run(
        [*cli, "-f", str(DOCKER / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        env={"PATH": env["PATH"], "POSTGRES_PASSWORD": "pw"},
        timeout=60,
    )
    assert missing.returncode != 0 and "OVERNIGHT_ADMIN_KEY" in missing.stderr
