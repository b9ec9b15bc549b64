"""Per-project bounds: quotas on stored bytes, files, open uploads and unfinished batches, and
validation and finalization taken fair share across projects (design invariant 9: a tenant
cannot slow another beyond its fair share)."""

import io
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import openai
import orjson
import pytest
from sqlalchemy import event

from app import main as app_main
from app.cli import main
from app.config import Settings
from app.db.session import engine_for
from app.services.steps import finalization, validation
from app.storage import storage_for
from tests.batch_sim import requests_file
from tests.fake_engine import fast
from tests.harness import RunningServer, running_server

ADMIN = "sk-admin-quotas-test"
REMEDY = "or have an admin raise the quota: POST /v1/admin/projects/{project}/quotas"


@contextmanager
def sdk(server: RunningServer, key: str = "sk-test") -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0) as client:
        yield client


def refusal(raised: pytest.ExceptionInfo[openai.RateLimitError]) -> str:
    """The quota refusal's message, once its shape is checked."""
    error = raised.value
    assert (error.status_code, error.code, error.type) == (
        429,
        "quota_exceeded",
        "insufficient_quota",
    )
    assert error.response.headers["x-should-retry"] == "false"  # the SDK does not retry it
    assert isinstance(error.body, dict)
    message: str = error.body["message"]
    return message


def add_file(client: openai.OpenAI, size: int) -> str:
    data = io.BytesIO(b"x" * size)
    return client.files.create(file=("f.txt", data), purpose="user_data").id


def new_upload(client: openai.OpenAI, size: int) -> str:
    return client.uploads.create(
        bytes=size, filename="u.txt", mime_type="text/plain", purpose="user_data"
    ).id


def stored_files(settings: Settings) -> int:
    return len(list(storage_for(str(settings.storage_dir)).list("files/")))


def test_stored_bytes_count_files_and_open_uploads_parts(settings: Settings) -> None:
    limited = settings.model_copy(update={"project_max_stored_bytes": 1000})
    with running_server(limited) as server, sdk(server) as client:
        kept = add_file(client, 600)
        with pytest.raises(openai.RateLimitError) as raised:
            add_file(client, 500)
        assert refusal(raised) == (
            "Quota exceeded: project default may hold at most 1,000 bytes "
            "(OVERNIGHT_PROJECT_MAX_STORED_BYTES) and holds 600; this request adds 500. "
            "Delete files or cancel uploads to make room, or have an admin raise the quota: "
            "POST /v1/admin/projects/default/quotas (`overnight projects quota`) for this "
            "project, OVERNIGHT_PROJECT_MAX_STORED_BYTES for every project."
        )
        # The refused file left nothing behind.
        assert [f.id for f in client.files.list()] == [kept]
        assert stored_files(limited) == 1

        # An open upload's parts count: 600 + 300 held, so 200 more bytes do not fit.
        upload = new_upload(client, 400)
        first = client.uploads.parts.create(upload_id=upload, data=b"y" * 300)
        with pytest.raises(openai.RateLimitError) as raised:
            add_file(client, 200)
        assert "holds 900; this request adds 200." in refusal(raised)
        small = add_file(client, 50)
        # A part the upload has room for, the project not: refused as it streams.
        with pytest.raises(openai.RateLimitError) as raised:
            client.uploads.parts.create(upload_id=upload, data=b"z" * 100)
        assert "holds 950; this request adds more than 50." in refusal(raised)

        client.files.delete(small)
        last = client.uploads.parts.create(upload_id=upload, data=b"z" * 100)
        done = client.uploads.complete(upload_id=upload, part_ids=[first.id, last.id])
        assert done.file is not None and done.file.bytes == 400
        # At the quota: even an upload's declared bytes are refused at its creation.
        with pytest.raises(openai.RateLimitError) as raised:
            new_upload(client, 1)
        assert "holds 1,000; this request adds 1." in refusal(raised)
        client.files.delete(kept)
        add_file(client, 600)


def test_files_quota_at_post_files_and_at_upload_creation_and_completion(
    settings: Settings,
) -> None:
    limited = settings.model_copy(update={"project_max_files": 2})
    with running_server(limited) as server, sdk(server) as client:
        first, _second = add_file(client, 10), add_file(client, 10)
        with pytest.raises(openai.RateLimitError) as raised:
            add_file(client, 10)
        assert refusal(raised).startswith(
            "Quota exceeded: project default may hold at most 2 files "
            "(OVERNIGHT_PROJECT_MAX_FILES) and holds 2; this request adds 1. "
            "Delete files to make room, or have an admin"
        )
        with pytest.raises(openai.RateLimitError):
            new_upload(client, 3)  # its file would not fit either
        assert stored_files(limited) == 2

        client.files.delete(first)
        upload = new_upload(client, 3)
        part = client.uploads.parts.create(upload_id=upload, data=b"abc")
        third = add_file(client, 10)  # takes the room the upload's file needed
        with pytest.raises(openai.RateLimitError) as raised:
            client.uploads.complete(upload_id=upload, part_ids=[part.id])
        assert "holds 2; this request adds 1." in refusal(raised)
        # Nothing was lost: the upload is pending with its part, and completes once there is room.
        client.files.delete(third)
        done = client.uploads.complete(upload_id=upload, part_ids=[part.id])
        assert done.status == "completed" and done.file is not None and done.file.bytes == 3


def test_open_uploads_quota(settings: Settings) -> None:
    limited = settings.model_copy(update={"project_max_open_uploads": 1})
    with running_server(limited) as server, sdk(server) as client:
        first = new_upload(client, 5)
        with pytest.raises(openai.RateLimitError) as raised:
            new_upload(client, 5)
        assert (
            "may hold at most 1 open uploads (OVERNIGHT_PROJECT_MAX_OPEN_UPLOADS) and holds 1; "
            "this request adds 1. Complete or cancel an open upload first, " in refusal(raised)
        )
        client.uploads.cancel(first)
        new_upload(client, 5)


def _batch(client: openai.OpenAI, prefix: str = "q") -> str:
    data = io.BytesIO(requests_file(2, prefix))
    file = client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def _wait(client: openai.OpenAI, batch_ids: list[str], *statuses: str) -> None:
    deadline = time.monotonic() + 60
    for batch_id in batch_ids:
        while (status := client.batches.retrieve(batch_id).status) not in statuses:
            assert time.monotonic() < deadline, (batch_id, status)
            time.sleep(0.05)


def test_unfinished_batches_quota(settings: Settings) -> None:
    limited = fast(settings, project_max_unfinished_batches=1)
    with running_server(limited) as server, sdk(server) as client:
        first = _batch(client)
        with pytest.raises(openai.RateLimitError) as raised:
            _batch(client)
        assert (
            "may hold at most 1 unfinished batches (OVERNIGHT_PROJECT_MAX_UNFINISHED_BATCHES) "
            "and holds 1; this request adds 1. Wait for a batch to end, or cancel one, "
            in refusal(raised)
        )
        client.batches.cancel(first)
        _wait(client, [first], "cancelled")
        _wait(client, [_batch(client)], "in_progress")


def test_concurrent_requests_pass_a_quota_exactly(settings: Settings) -> None:
    """Eight files at once, room for three: three are kept, five refused, on both databases."""
    limited = settings.model_copy(update={"project_max_files": 3})
    engine = engine_for(limited.sqlalchemy_url)

    def widen_the_race(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        # Between counting the files and recording the new one: without the project's lock,
        # every request would count the same files here and all eight would be kept.
        if "count(*)" in statement and "FROM files" in statement:
            time.sleep(0.1)

    event.listen(engine, "after_cursor_execute", widen_the_race)
    try:
        with running_server(limited) as server, sdk(server) as client:
            start = threading.Barrier(8)
            outcomes: list[str] = []

            def send() -> None:
                start.wait()
                try:
                    add_file(client, 10)
                    outcomes.append("kept")
                except openai.RateLimitError:
                    outcomes.append("refused")

            threads = [threading.Thread(target=send) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert Counter(outcomes) == {"kept": 3, "refused": 5}
            assert len(client.files.list().data) == 3
            assert stored_files(limited) == 3
    finally:
        event.remove(engine, "after_cursor_execute", widen_the_race)


# -- a project's own quotas (admin API and CLI) --


def _keys(admin: openai.OpenAI, *projects: str) -> dict[str, str]:
    return {
        name: admin.post("/admin/api_keys", body={"project": name}, cast_to=dict)["value"]
        for name in projects
    }


def test_an_admin_sets_a_projects_own_quotas(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    keyed = settings.model_copy(
        update={"admin_key": ADMIN, "project_max_files": 1, "project_max_open_uploads": 5}
    )
    with running_server(keyed) as server, sdk(server, ADMIN) as admin:
        keys = _keys(admin, "loose", "tight")
        cli = ["--base-url", server.base_url, "--api-key", ADMIN]

        # Looser, through the CLI: three files where the deployment allows one.
        assert main(["projects", "quota", "loose", "--files", "3", *cli]) == 0
        assert capsys.readouterr().out == (
            "loose: unlimited bytes (default), 3 files (own), 5 open uploads (default), "
            "unlimited unfinished batches (default)\n"
        )
        # Tighter, through the API: no upload at all.
        tight = admin.post(
            "/admin/projects/tight/quotas", body={"max_open_uploads": 0}, cast_to=dict
        )
        assert tight["object"] == "project.quotas" and tight["project_name"] == "tight"
        assert tight["open_uploads"] == {"used": 0, "limit": 0, "override": 0}
        assert tight["files"] == {"used": 0, "limit": 1, "override": None}

        with sdk(server, keys["loose"]) as loose, sdk(server, keys["tight"]) as narrow:
            for _ in range(3):
                add_file(loose, 10)
            with pytest.raises(openai.RateLimitError) as raised:
                add_file(loose, 10)
            assert refusal(raised).startswith(
                "Quota exceeded: project loose may hold at most 3 files (its own quota) and "
                "holds 3; this request adds 1. Delete files to make room, "
                + REMEDY.format(project="loose")
            )
            narrow_file = add_file(narrow, 10)
            with pytest.raises(openai.RateLimitError) as raised:
                add_file(narrow, 10)
            assert "at most 1 files (OVERNIGHT_PROJECT_MAX_FILES)" in refusal(raised)
            with pytest.raises(openai.RateLimitError) as raised:
                new_upload(narrow, 1)
            assert "at most 0 open uploads (its own quota) and holds 0" in refusal(raised)

            assert main(["projects", "quotas", "loose", "--json", *cli]) == 0
            listed = orjson.loads(capsys.readouterr().out)
            assert listed["files"] == {"used": 3, "limit": 3, "override": 3}
            assert listed["stored_bytes"] == {"used": 30, "limit": None, "override": None}
            assert main(["projects", "quotas", "loose", *cli]) == 0
            table = capsys.readouterr().out
            assert "3 files (own)" in table and "unlimited bytes (default)" in table

            # Back to the deployment's: null through the API, `default` through the CLI.
            back = admin.post(
                "/admin/projects/loose/quotas", body={"max_files": None}, cast_to=dict
            )
            assert back["files"] == {"used": 3, "limit": 1, "override": None}
            with pytest.raises(openai.RateLimitError):
                add_file(loose, 10)
            assert main(["projects", "quota", "tight", "--open-uploads", "default", *cli]) == 0
            assert "5 open uploads (default)" in capsys.readouterr().out
            narrow.files.delete(narrow_file)  # the upload's file will need room too
            new_upload(narrow, 1)

            # Only an admin reads or sets them; bad values and unknown projects are refused.
            with pytest.raises(openai.PermissionDeniedError):
                loose.post("/admin/projects/loose/quotas", body={"max_files": 99}, cast_to=dict)
            with pytest.raises(openai.PermissionDeniedError):
                loose.get("/admin/projects/loose/quotas", cast_to=dict)
        with pytest.raises(openai.BadRequestError):
            admin.post("/admin/projects/loose/quotas", body={"max_files": -1}, cast_to=dict)
        with pytest.raises(openai.NotFoundError):
            admin.get("/admin/projects/nobody/quotas", cast_to=dict)
        assert main(["projects", "quota", "loose", *cli]) == 1
        assert "--stored-bytes" in capsys.readouterr().err


# -- fair share of validation and finalization --


def _recording(order: list[str], real: Callable[..., Any], batch_id: Callable[[Any], str]) -> Any:
    def step(*args: Any) -> Any:
        order.append(batch_id(args[2]))  # the lease or the finalization job
        return real(*args)

    return step


@pytest.mark.parametrize("step", ["validation", "finalization"])
def test_one_projects_queue_does_not_hold_back_another_projects_batch(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    keyed = fast(settings, admin_key=ADMIN)
    with monkeypatch.context() as quiet:
        quiet.setattr(app_main, "BACKGROUND_LOOPS", [])  # the batches wait, nothing takes them
        with running_server(keyed) as server, sdk(server, ADMIN) as admin:
            keys = _keys(admin, "a", "b")
            with sdk(server, keys["a"]) as a, sdk(server, keys["b"]) as b:
                queued = [_batch(a, f"a{i}") for i in range(6)]
                late = _batch(b, "b")
                if step == "finalization":
                    for client, batch_id in [*((a, q) for q in queued), (b, late)]:
                        client.batches.cancel(batch_id)

    order: list[str] = []
    if step == "validation":
        took = _recording(order, validation.validate, lambda lease: lease.batch_id)
        monkeypatch.setattr(validation, "validate", took)
        ended = "in_progress"
    else:
        took = _recording(order, finalization.finalize, lambda job: job.lease.batch_id)
        monkeypatch.setattr(finalization, "finalize", took)
        ended = "cancelled"
    with running_server(keyed) as server, sdk(server, keys["a"]) as a, sdk(server, keys["b"]) as b:
        _wait(a, queued, ended)
        _wait(b, [late], ended)
    # Oldest first would take b's batch last; fair share takes it second, five of a's still queued.
    assert sorted(order) == sorted([*queued, late])
    assert order.index(late) == 1, order
