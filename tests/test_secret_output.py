"""No secret in what overnight prints: database passwords and keys stay out of its output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from app.config import Settings
from app.core.redaction import masked_url
from tests.harness import fresh_database

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-Pa55"


def test_masked_url_hides_every_password() -> None:
    assert masked_url(f"postgresql+psycopg://root:{PASSWORD}@db:5432/x?sslmode=require") == (
        "postgresql+psycopg://root:***@db:5432/x?sslmode=require"
    )
    assert PASSWORD not in masked_url(f"postgresql://db/x?password={PASSWORD}")
    assert masked_url(f"s3://key:{PASSWORD}@bucket/prefix") == "s3://key:***@bucket/prefix"
    assert (
        masked_url(f"postgresql://root:{PASSWORD}@db:port/x") == "postgresql://root:***@db:port/x"
    )
    assert masked_url("sqlite:////srv/data/overnight.db") == "sqlite:////srv/data/overnight.db"


@pytest.mark.backends("postgresql")
def test_db_upgrade_prints_the_url_without_its_password(backend: str, tmp_path: Path) -> None:
    with fresh_database(backend, tmp_path) as url:
        # The test server trusts local connections: any password gets in.
        with_password = make_url(url).set(password=PASSWORD).render_as_string(False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_")}
        env |= {"OVERNIGHT_DATABASE_URL": with_password, "OVERNIGHT_DATA_DIR": str(tmp_path)}
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "db", "upgrade"],
            env=env | {"PYTHONPATH": str(REPO)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert ":***@" in done.stdout


def test_a_settings_error_shows_no_secret() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(  # type: ignore[call-arg]
            _env_file=None,
            database_url=f"postgresql://root:{PASSWORD}@db/x",
            storage_url="s3:///no-bucket",
            admin_key=f"sk-{PASSWORD}",
        )
    assert "storage URL must look like s3://bucket" in str(refused.value)
    assert PASSWORD not in str(refused.value)
