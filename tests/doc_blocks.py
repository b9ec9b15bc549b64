"""The code blocks of the documentation's pages, and running them as a reader would.

A block not meant to run carries `<!-- docs-test: skip (why) -->` on the line before its
fence. Shell blocks run in bash with `-euo pipefail`, Python blocks in this interpreter, and a
JavaScript block is saved under the name its first line gives (`// batch.mjs`) for the shell
block after it to run, as the page tells the reader to do.
"""

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
SKIP_MARK = re.compile(r"^<!-- docs-test: skip \((?P<why>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<kind>[\w-]*)\s*$")
RUNNABLE = {"bash", "python", "javascript"}
# Below pytest's own timeout (900 s), so that a block that never ends fails with its output.
BLOCK_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    page: str
    kind: str
    code: str
    skip_reason: str | None

    @property
    def first_line(self) -> str:
        return self.code.splitlines()[0] if self.code else ""


@dataclass(frozen=True)
class Ran:
    block: Block
    stdout: str


def blocks(page: str) -> list[Block]:
    """Every fenced block of `docs/<page>`, in order."""
    lines = (DOCS / page).read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        mark = SKIP_MARK.match(before)
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(page, opening["kind"], code, mark["why"] if mark else None))
        index = end + 1
    return found


def example_pages() -> list[str]:
    """Getting started, then every guide, in the site's navigation order."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    pages = ["getting-started.md"]
    for entry in nav:
        for section, value in entry.items():
            if section == "Guides":
                pages += [page for item in value for page in item.values()]
    return pages


def run(block: Block, workdir: Path, env: dict[str, str], ports: dict[str, str]) -> Ran:
    """Runs one block in `workdir` with the documented addresses moved to `ports`."""
    code = block.code
    for documented, actual in ports.items():
        code = code.replace(documented, actual)
    if block.kind == "javascript":
        name = code.splitlines()[0].removeprefix("//").strip()
        (workdir / name).write_text(code)
        return Ran(block, "")
    command = [sys.executable, "-c", code]
    if block.kind == "bash":
        command = ["bash", "-euo", "pipefail", "-c", code]
    try:
        result = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
    except subprocess.TimeoutExpired as late:
        what = f"still running after {BLOCK_TIMEOUT} s"
        raise AssertionError(_report(block, what, late.stdout, late.stderr)) from None
    what = f"failed ({result.returncode})"
    assert result.returncode == 0, _report(block, what, result.stdout, result.stderr)
    return Ran(block, result.stdout)


def _report(block: Block, what: str, stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    def tail(output: str | bytes | None) -> str:
        text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
        return text[-3000:]

    return f"{block.page}: {block.kind} block {what}:\n{block.code}\n" + (
        f"stdout:\n{tail(stdout)}\nstderr:\n{tail(stderr)}"
    )
