"""API keys and projects: bearer auth, 401s, open mode, and isolation between projects (404)."""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import update

from app.cli import check_bind_safety
from app.config import Settings
from app.db.models import ApiKey
from app.db.session import session_scope, upgrade
from app.services.auth import create_key, ensure_project
from tests.forms import Part, content_type, multipart
from tests.harness import RunningServer, running_server
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
    with httpx.Client(timeout=60, base_url=server.url) as http:
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
    assert check_bind_safety(settings.model_copy(update={"host": "127.0.0.1"})).started_open
    with pytest.raises(SystemExit, match=r"Refusing to listen on 0\.0\.0\.0"):
        check_bind_safety(settings.model_copy(update={"host": "0.0.0.0"}))
    make_key(settings, "ops")
    assert not check_bind_safety(settings.model_copy(update={"host": "0.0.0.0"})).started_open


def revoke_every_key_in_the_database(settings: Settings) -> None:
    """What another replica, a script or a hand-written UPDATE could do behind the API's back."""
    with session_scope(settings) as session:
        session.execute(update(ApiKey).values(revoked_at=1))


def test_a_server_started_with_keys_never_opens(settings: Settings) -> None:
    # Keys revoked behind the API's back are refused at once without the principal cache
    # (test_revoked_keys_are_refused_within_the_cache_ttl times it with the cache).
    settings = settings.model_copy(update={"auth_cache_seconds": 0.0})
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        admin_key, admin_secret = create_key(session, "ops", role="admin")
        member_key, _ = create_key(session, "team")
    with running_server(settings) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        assert http.get("/readyz").json()["access"] == "keys_required"
        admin = {"Authorization": f"Bearer {admin_secret}"}
        assert http.delete(f"/v1/admin/api_keys/{member_key.id}", headers=admin).status_code == 200
        refused = assert_error(
            http.delete(f"/v1/admin/api_keys/{admin_key.id}", headers=admin), 409
        )
        assert refused["code"] == "last_admin_key"
        assert "overnight keys create --role admin" in refused["message"]
        assert http.get("/v1/files", headers=admin).status_code == 200

        revoke_every_key_in_the_database(settings)
        assert_error(http.get("/v1/files"), 401)
        assert_error(http.get("/v1/admin/api_keys", headers=admin), 401)
        assert http.get("/readyz").json()["access"] == "keys_required"
        assert http.get("/dashboard/api/batches").status_code == 401


def test_a_server_started_open_closes_for_good_once_a_key_exists(server: RunningServer) -> None:
    with httpx.Client(timeout=60, base_url=server.url) as http:
        assert http.get("/readyz").json()["access"] == "open"
        created = http.post("/v1/admin/api_keys", json={"project": "ops", "role": "admin"})
        assert created.status_code == 200
        assert_error(http.get("/v1/files"), 401)
        assert http.get("/readyz").json()["access"] == "keys_required"
        key = {"Authorization": f"Bearer {created.json()['value']}"}
        assert http.get("/v1/files", headers=key).status_code == 200

        revoke_every_key_in_the_database(server.settings)
        assert_error(http.get("/v1/files"), 401)
        assert http.get("/readyz").json()["access"] == "keys_required"


def test_revoked_keys_are_refused_within_the_cache_ttl(settings: Settings) -> None:
    ttl = 1.5
    settings = settings.model_copy(update={"auth_cache_seconds": ttl})
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        _, admin_secret = create_key(session, "ops", role="admin")
        member_key, member_secret = create_key(session, "team")
        _, other_secret = create_key(session, "team")
    admin = {"Authorization": f"Bearer {admin_secret}"}
    member = {"Authorization": f"Bearer {member_secret}"}
    other = {"Authorization": f"Bearer {other_secret}"}
    with running_server(settings) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        assert http.get("/v1/files", headers=member).status_code == 200
        first_lookup = time.monotonic()
        assert http.get("/v1/files", headers=other).status_code == 200
        # Revoked through this API process: refused from the next request on.
        revoked = http.delete(f"/v1/admin/api_keys/{member_key.id}", headers=admin)
        assert revoked.status_code == 200
        assert_error(http.get("/v1/files", headers=member), 401)

        # Revoked behind its back (another replica, the CLI on the database): the cached
        # lookup still lets the key in, for at most `ttl` seconds from that lookup.
        # Bounds from the client's clock that hold however slow a request is: the lookup in
        # use happened between first_lookup and answered; a request let in began before it
        # expired, the first one refused ended after that.
        assert http.get("/v1/files", headers=other).status_code == 200
        answered = time.monotonic()
        revoke_every_key_in_the_database(settings)
        assert http.get("/v1/files", headers=other).status_code == 200
        while True:
            sent = time.monotonic()
            if http.get("/v1/files", headers=other).status_code != 200:
                break
            assert sent < answered + ttl, "a revoked key was let in after the cache ttl"
            time.sleep(0.05)
        assert time.monotonic() >= first_lookup + ttl, "refused before the cache ttl ran out"
        # Nothing reopens the API: no key, a revoked key or a made-up one are all 401.
        for headers in ({}, other, admin, {"Authorization": "Bearer sk-made-up"}):
            assert_error(http.get("/v1/files", headers=headers), 401)


def test_cli_keeps_the_last_admin_key(settings: Settings, tmp_path: Path) -> None:
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        key_id = create_key(session, "ops", role="admin")[0].id
    env = {
        **os.environ,
        "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url,
        "OVERNIGHT_DATA_DIR": str(settings.data_dir),
    }
    env.pop("OVERNIGHT_ADMIN_KEY", None)
    command = [sys.executable, "-m", "app.cli", "keys", "revoke", key_id]
    refused = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1
    assert "last admin key" in refused.stderr and "--role admin" in refused.stderr
    allowed = subprocess.run(
        command,
        cwd=tmp_path,
        env={**env, "OVERNIGHT_ADMIN_KEY": "sk-break-glass"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert allowed.stdout.startswith(f"{key_id} revoked: requests with it now get 401")


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
