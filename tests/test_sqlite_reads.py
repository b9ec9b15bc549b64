"""On SQLite, reading requests do not wait for the write lock (WAL readers need none)."""

import time
from pathlib import Path

import httpx
from sqlalchemy import text

from app.config import Settings
from app.db.session import session_scope, upgrade
from tests.harness import running_server


def test_reads_are_not_blocked_by_a_writer(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    upgrade(settings.sqlalchemy_url)
    with running_server(settings) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        assert (
            http.post(
                "/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"}
            ).status_code
            == 200
        )
        with session_scope(settings) as session:
            session.execute(text("UPDATE projects SET name = name"))  # holds the write lock
            started = time.monotonic()
            listed = http.get("/v1/files", timeout=10)
            waited = time.monotonic() - started
        assert listed.status_code == 200
        assert len(listed.json()["data"]) == 1
        # A read that took the write lock would wait out busy_timeout (30 s) behind it.
        assert waited < 10, f"a read waited {waited:.1f} s for the writer"
