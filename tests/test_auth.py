"""API keys and projects: bearer auth, 401s, open mode, and isolation between projects (404)."""

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from app.cli import check_bind_safety
from app.config import Settings
from app.db.session import session_scope, upgrade
from app.services.auth import create_key, ensure_project
from tests.forms import Part, content_type, multipart
from tests.harness import RunningServer
from tests.spec import assert_error


def make_key(settings: Settings, project: str) -> str:
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        return create_key(session, project)[1]


def sdk(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key=key, max_retries=0, _strict_response_validation=True
    )


def test_projects_are_isolated(server: RunningServer, settings: Settings) -> None:
    alice_key, bob_key = make_key(settings, "alice"), make_key(settings, "bob")
    alice, bob = sdk(server, alice_key), sdk(server, bob_key)

    mine = alice.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    upload = alice.uploads.create(
        bytes=3, filename="u.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    part = alice.uploads.parts.create(upload_id=upload.id, data=b"{}\n")

    assert bob.files.list().data == []
    for call in (
        lambda: bob.files.retrieve(mine.id),
        lambda: bob.files.content(mine.id),
        lambda: bob.files.delete(mine.id),
        lambda: bob.uploads.parts.create(upload_id=upload.id, data=b"x"),
        lambda: bob.uploads.complete(upload_id=upload.id, part_ids=[part.id]),
        lambda: bob.uploads.cancel(upload.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    # A cursor from another project is as unknown as a made-up one.
    with pytest.raises(openai.BadRequestError) as info:
        bob.files.list(after=mine.id)
    assert info.value.param == "after"
    # Bob's own upload cannot borrow Alice's part either.
    bobs = bob.uploads.create(bytes=3, filename="b.jsonl", mime_type="text/plain", purpose="batch")
    with pytest.raises(openai.BadRequestError):
        bob.uploads.complete(upload_id=bobs.id, part_ids=[part.id])

    # Nothing Bob tried changed Alice's objects.
    assert alice.files.content(mine.id).content == b"{}\n"
    done = alice.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert done.file is not None
    assert {f.id for f in alice.files.list()} == {mine.id, done.file.id}
    assert bob.files.list().data == []


def test_keys_are_required_once_they_exist(server: RunningServer, settings: Settings) -> None:
    with httpx.Client(base_url=server.url) as http:
        # Open mode: no key configured, any bearer token (or none) is the default project.
        opened = http.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", b"{}\n")}
        )
        assert opened.status_code == 200
        assert sdk(server, "anything").files.list().data[0].id == opened.json()["id"]

        key = make_key(settings, "team")
        assert_error(http.get("/v1/files"), 401, message="Missing bearer")
        wrong = http.get("/v1/files", headers={"Authorization": "Bearer sk-wrong"})
        assert assert_error(wrong, 401)["code"] == "invalid_api_key"
        assert_error(
            http.post(
                "/v1/files",
                content=multipart(Part("purpose", b"batch")),
                headers={**content_type(), "Authorization": "Basic abc"},
            ),
            401,
        )
        with pytest.raises(openai.AuthenticationError):
            sdk(server, "sk-wrong").files.list()
        # The key's project starts empty: the open-mode file belongs to the default project.
        assert sdk(server, key).files.list().data == []
        assert not any((settings.storage_dir / ".tmp").iterdir())


def test_cli_creates_a_working_key(
    server: RunningServer, settings: Settings, tmp_path: Path
) -> None:
    env = {**os.environ, "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url}
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--project", "cli-team"],
        cwd=tmp_path,
        env={**env, "OVERNIGHT_DATA_DIR": str(settings.data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    key = result.stdout.strip()
    assert key.startswith("sk-ovn-") and "\n" not in key
    assert "cli-team" in result.stderr
    client = sdk(server, key)
    made = client.files.create(file=("k.jsonl", b"{}\n"), purpose="batch")
    assert [f.id for f in client.files.list()] == [made.id]
    with pytest.raises(openai.AuthenticationError):
        sdk(server, key[:-2] + "xx").files.list()


def test_bind_safety(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    assert check_bind_safety(settings.model_copy(update={"host": "127.0.0.1"})) is not None
    with pytest.raises(SystemExit, match=r"Refusing to listen on 0\.0\.0\.0"):
        check_bind_safety(settings.model_copy(update={"host": "0.0.0.0"}))
    make_key(settings, "ops")
    assert check_bind_safety(settings.model_copy(update={"host": "0.0.0.0"})) is None


def test_first_requests_racing_create_one_project(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    barrier = threading.Barrier(6)

    def first_request() -> str:
        barrier.wait()
        with session_scope(settings) as session:
            return ensure_project(session, "racy").id

    with ThreadPoolExecutor(6) as pool:
        ids = set(pool.map(lambda _: first_request(), range(6)))
    assert len(ids) == 1
