"""The code stays ruff- and mypy-clean: CI runs these with the rest of the suite."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["app", "worker", "tests", "bench", "migrations"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_lint() -> None:
    result = _run("ruff", "check", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run("ruff", "format", "--check", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def _product_modules() -> list[Path]:
    return sorted(p for d in ("app", "worker") for p in (ROOT / d).rglob("*.py"))


def test_product_code_silences_no_type_check() -> None:
    silenced = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _product_modules()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "# type: ignore" in line
    ]
    assert not silenced


def test_no_product_module_is_over_400_lines() -> None:
    """One concept per module: a module past 400 lines holds more than one."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _product_modules()}
    assert {p: n for p, n in sizes.items() if n > 400} == {}
    assert len(sizes) > 150  # the walk found the product
