"""A throwaway PostgreSQL 15 cluster of a test's own, to restart and stop at will.

The shared server on 127.0.0.1:5432 serves everyone's tests and is never touched. PostgreSQL
refuses to run as root, so as root the cluster runs as the `postgres` user, in a directory
of /tmp it owns (pytest's own tmp dirs are private to root).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.harness import free_port

BIN = Path("/usr/lib/postgresql/15/bin")


class PrivatePostgres:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="overnight-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        command = [str(BIN / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=check, capture_output=True, cwd=self.root)

    def _ctl(self, action: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "server.log")
        self._run(
            "pg_ctl", action, "-D", str(self.data), "-m", "fast", "-w", "-o", options, "-l", log
        )

    def start(self) -> None:
        self._ctl("start")

    def stop(self) -> None:
        self._ctl("stop")

    def restart(self) -> None:
        self._ctl("restart")

    def create_database(self, name: str) -> str:
        """Creates a database; returns its SQLAlchemy URL."""
        with psycopg.connect(self._url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self._url(name).replace("postgresql://", "postgresql+psycopg://")

    def _url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
