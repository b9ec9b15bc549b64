"""The Docker files: parsed here (no Docker engine on this machine), built elsewhere.

They must install with the README's installer (docker/install.sh), and compose must run
PostgreSQL, the API and scalable workers on one shared data volume.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

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
    assert ("VOLUME", "/data") in steps and ("EXPOSE", "8000") in steps
    assert steps[-1] == ("CMD", '["overnight", "serve"]')
    assert any(word == "HEALTHCHECK" and "/healthz" in args for word, args in steps)
    # The installer the images run is the README's.
    readme = (ROOT / "README.md").read_text()
    assert "bash docker/install.sh && .venv/bin/overnight serve" in readme
    assert (DOCKER / "install.sh").exists()


def test_the_build_context_leaves_local_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "data", ".git", "test-artifacts"} <= set(ignored)


def test_compose_runs_postgres_api_and_workers_on_one_volume() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "api", "worker", "embedder"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["api"]["command"][:2] == ["overnight", "api"]
    assert services["worker"]["command"] == [
        "overnight", "worker", "--model", "SmolLM2-135M-Instruct"
    ]  # fmt: skip
    assert services["embedder"]["command"][-1] == "all-MiniLM-L6-v2"
    assert "replicas" in services["worker"]["deploy"]
    for name in ("api", "worker", "embedder"):
        service = services[name]
        assert service["volumes"] == ["data:/data"], name
        env = service["environment"]
        assert env["OVERNIGHT_DATABASE_URL"].startswith("postgresql+psycopg://"), name
        assert "@postgres:5432/" in env["OVERNIGHT_DATABASE_URL"]
        assert env["OVERNIGHT_DATA_DIR"] == "/data"
        assert service["build"]["dockerfile"] == "docker/${OVERNIGHT_DOCKERFILE:-Dockerfile.cpu}"
        assert service["build"]["context"] == ".."
    assert services["api"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    assert set(compose["volumes"]) == {"data", "pgdata"}


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
    env = {"OVERNIGHT_ADMIN_KEY": "sk-test", "PATH": "/usr/local/bin:/usr/bin:/bin"}
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
        env={"PATH": env["PATH"]},
        timeout=60,
    )
    assert missing.returncode != 0 and "OVERNIGHT_ADMIN_KEY" in missing.stderr
