"""Migrations run once: processes that start together on a fresh database take turns.

Every API replica and worker runs `alembic upgrade head` at start-up (a Kubernetes rollout
starts them together). Without a lock they all create the schema at once and all but one
crash; with it, the first migrates and the others find the schema at head.
"""

import os
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.db.models import Base
from app.db.session import alembic_config, engine_for
from tests.harness import fresh_database

REPO = Path(__file__).resolve().parent.parent
PROCESSES = 4
# `overnight db upgrade` once its imports are done, at a signal on stdin: a Python start
# costs more than the migrations themselves, so unsynchronised starts would rarely overlap.
TOGETHER = (
    "import sys\n"
    "from app.cli import main\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "sys.exit(main(['db', 'upgrade']))\n"
)


def _start(url: str, data_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OVERNIGHT_DATABASE_URL": url, "OVERNIGHT_DATA_DIR": str(data_dir)}
    return subprocess.Popen(
        [sys.executable, "-c", TOGETHER],
        cwd=REPO,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _upgrade_together(url: str, data_dir: Path) -> list[tuple[int, str]]:
    """Runs `db upgrade` in PROCESSES processes at once; their exit codes and stderr."""
    processes = [_start(url, data_dir) for _ in range(PROCESSES)]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    outcomes = []
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        outcomes.append((process.returncode, stderr))
    return outcomes


def test_processes_upgrading_a_fresh_database_at_once_all_succeed(
    backend: str, tmp_path: Path
) -> None:
    with fresh_database(backend, tmp_path) as url:
        outcomes = _upgrade_together(url, tmp_path)
        assert [code for code, _ in outcomes] == [0] * PROCESSES, "\n".join(
            stderr for _, stderr in outcomes
        )
        heads = ScriptDirectory.from_config(alembic_config(url)).get_heads()
        with engine_for(url).connect() as conn:
            context = MigrationContext.configure(conn)
            assert set(context.get_current_heads()) == set(heads)
            assert compare_metadata(context, Base.metadata) == []
