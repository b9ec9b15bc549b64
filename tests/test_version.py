"""One version wherever a person or a scraper looks: CLI, banner, /metrics, dashboard, the
OpenAPI document, the package metadata and the changelog, all read from `app/version.py`."""

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.supervisor import banner
from app.version import __version__
from tests.engine_fixtures import REPO
from tests.harness import running_server

VERSION = __version__


def test_the_package_metadata_reads_the_one_version() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "app.version.__version__"}
    assert version("overnight") == VERSION  # as installed


def test_the_changelogs_newest_release_is_this_version() -> None:
    releases = re.findall(r"^## \[(\d[^\]]*)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert releases, "CHANGELOG.md names no release"
    assert releases[0] == VERSION


def test_the_published_openapi_document_has_this_version() -> None:
    published = json.loads((REPO / "openapi" / "openapi.json").read_text())
    assert published["info"]["version"] == VERSION


def test_overnight_version_prints_the_installed_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"overnight {VERSION}"


def test_the_banner_names_the_version() -> None:
    text = banner("http://127.0.0.1:8000", ["SmolLM2-135M-Instruct"], open_mode=True)
    assert f"overnight {VERSION} is running" in text


def test_metrics_and_dashboard_show_the_version(settings: Settings) -> None:
    with running_server(settings) as server:
        http = httpx.Client(base_url=server.url, timeout=30)
        families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
        [sample] = families["overnight_build_info"].samples
        assert (sample.name, sample.labels, sample.value) == (
            "overnight_build_info",
            {"version": VERSION},
            1.0,
        )
        page = http.get("/dashboard").text
        assert f'<footer class="foot">overnight {VERSION}</footer>' in page
        assert http.get("/openapi.json").json()["info"]["version"] == VERSION
