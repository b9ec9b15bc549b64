"""OpenAI's enqueued limits: a project's unfinished batches may hold so many prompt tokens
(and requests) per model; a batch past the limit fails as OpenAI's does."""

import io
import threading
import time
from collections import Counter

import openai
import orjson
import pytest
from sqlalchemy import event, select

from app.cli import main
from app.config import Settings
from app.core.states import BatchStatus
from app.db.models import Batch
from app.db.session import engine_for, session_scope, upgrade
from app.schemas.batches import CreateBatchRequest
from app.services import batches, enqueued
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from tests.batch_sim import MODEL, requests_file, run_batch, store_input_file
from tests.fake_engine import fast
from tests.harness import running_server

LINES = 6  # requests per batch; shards of 2 lines
RETRY = "Please try again once some in_progress batches have been completed."


def batch_tokens(prefix: str) -> int:
    data = requests_file(LINES, prefix)
    return sum(
        enqueued.estimate_prompt_tokens(orjson.loads(line)["body"]) for line in data.splitlines()
    )


def test_estimate_counts_text_by_four_characters_and_token_ids_one_each() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 41}], "max_tokens": 999}
    # "user" (1) + 41 characters (11) + the message's template overhead (4)
    assert enqueued.estimate_prompt_tokens(chat) == 16
    assert enqueued.estimate_prompt_tokens({"prompt": [1, 2, 3], "suffix": "ignored"}) == 3
    assert enqueued.estimate_prompt_tokens({"input": ["abcd", "abcde"]}) == 3


def _create(settings: Settings, prefix: str) -> str:
    file_id = store_input_file(settings, requests_file(LINES, prefix))
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        return batches.create_batch(session, settings, project_id, params).id


def test_concurrent_validations_admit_exactly_the_allowed_batches(settings: Settings) -> None:
    """Eight validators at once, room for three batches: three run, five fail, every time."""
    per_batch = batch_tokens("p0")  # every prefix below has the same length
    limited = settings.model_copy(
        update={"shard_lines": 2, "enqueued_token_limit": 3 * per_batch + per_batch // 2}
    )
    upgrade(limited.sqlalchemy_url)
    engine = engine_for(limited.sqlalchemy_url)

    def widen_the_race(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        # Between reading what is enqueued and committing: without the project lock, every
        # validator would read the same sum here and all eight would be admitted.
        if "sum(shards.prompt_tokens)" in statement:
            time.sleep(0.1)

    event.listen(engine, "after_cursor_execute", widen_the_race)
    for round_ in range(2):
        ids = [_create(limited, f"r{round_}b{i}") for i in range(8)]
        start = threading.Barrier(8)

        def validate(owner: str, start: threading.Barrier = start) -> None:
            start.wait()
            validate_pending(limited, owner)

        threads = [threading.Thread(target=validate, args=(f"v{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        with session_scope(limited) as session:
            found = session.execute(select(Batch.status, Batch.errors).where(Batch.id.in_(ids)))
            rows = found.all()
            statuses = Counter(status for status, _ in rows)
            codes = {e["code"] for _, errors in rows for e in errors or []}
        assert statuses == {BatchStatus.IN_PROGRESS: 3, BatchStatus.FAILED: 5}, round_
        assert codes == {"token_limit_exceeded"}
        assert all(len(errors) == 1 for status, errors in rows if status == BatchStatus.FAILED)
        # Cancelled batches end and release their tokens for the next round.
        with session_scope(limited) as session:
            project_id = ensure_project(session, DEFAULT_PROJECT).id
            assert enqueued.enqueued(session, project_id, MODEL) == (3 * per_batch, 3 * LINES)
            for batch_id in ids:
                if (
                    session.scalar(select(Batch.status).where(Batch.id == batch_id))
                    == "in_progress"
                ):
                    batches.cancel_batch(session, project_id, batch_id)
        finalize_ready_batches(limited, "finalizer")
        with session_scope(limited) as session:
            assert enqueued.enqueued(session, project_id, MODEL) == (0, 0)


def _wait(client: openai.OpenAI, batch_id: str, *statuses: str) -> openai.types.Batch:
    deadline = time.monotonic() + 30
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.05)
    return batch


def _submit(client: openai.OpenAI, prefix: str) -> str:
    data = io.BytesIO(requests_file(LINES, prefix))
    file = client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


@pytest.mark.parametrize("kind", ["tokens", "requests"])
def test_the_sdk_sees_openais_failure_and_a_finished_batch_lets_the_next_in(
    settings: Settings, kind: str
) -> None:
    per_batch = batch_tokens("a0")
    limit: dict[str, dict[str, object]] = {
        "tokens": {"enqueued_token_limits": {MODEL: per_batch + 1}},
        "requests": {"enqueued_request_limit": LINES},
    }
    limited = fast(settings, shard_lines=2, **limit[kind])
    with (
        running_server(limited) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        first = _wait(client, _submit(client, "a0"), "in_progress")
        refused = _wait(client, _submit(client, "a1"), "failed")
        assert refused.errors is not None and refused.errors.data is not None
        [error] = refused.errors.data
        if kind == "tokens":
            expected = (
                f"Enqueued token limit reached for {MODEL} in organization default. "
                f"Limit: {per_batch + 1:,} enqueued tokens. {RETRY}"
            )
            assert error.code == "token_limit_exceeded"
        else:
            expected = (
                f"Enqueued request limit reached for {MODEL} in organization default. "
                f"Limit: {LINES:,} enqueued requests. {RETRY}"
            )
            assert error.code == "request_limit_exceeded"
        assert (error.message, error.line, error.param) == (expected, None, None)
        assert refused.failed_at is not None and refused.in_progress_at is None

        run_batch(limited, first.id)
        _wait(client, first.id, "completed")
        _wait(client, _submit(client, "a2"), "in_progress")


# -- a project's own limits (admin API and CLI) --

ADMIN = "sk-admin-limits-test"


def _refusal(client: openai.OpenAI, prefix: str) -> tuple[str, str]:
    refused = _wait(client, _submit(client, prefix), "failed")
    assert refused.errors is not None and refused.errors.data is not None
    [error] = refused.errors.data
    assert error.code is not None and error.message is not None
    return error.code, error.message


def test_an_admin_sets_a_projects_own_limits_tighter_or_looser_than_the_default(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    per_batch = batch_tokens("c0")  # every prefix below has the same length
    default = per_batch + per_batch // 2  # room for one batch
    limited = fast(settings, admin_key=ADMIN, shard_lines=2, enqueued_token_limit=default)
    with (
        running_server(limited) as server,
        openai.OpenAI(base_url=server.base_url, api_key=ADMIN, max_retries=0) as admin,
    ):
        keys = {
            name: admin.post("/admin/api_keys", body={"project": name}, cast_to=dict)["value"]
            for name in ("tight", "loose", "plain")
        }
        sdk = {
            name: openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
            for name, key in keys.items()
        }
        cli = ["--base-url", server.base_url, "--api-key", ADMIN]

        # Looser, through the CLI: room for two batches where the default has one.
        looser = 2 * per_batch + per_batch // 2
        assert main(["projects", "limit", "loose", MODEL, "--tokens", str(looser), *cli]) == 0
        assert capsys.readouterr().out == (
            f"loose on {MODEL}: {looser:,} tokens (own), unlimited requests (default)\n"
        )
        # Tighter, through the API: not even one batch fits.
        tight = admin.post(
            "/admin/projects/tight/limits",
            body={"model": MODEL, "token_limit": per_batch - 1},
            cast_to=dict,
        )
        assert tight["token_limit"] == tight["token_limit_override"] == per_batch - 1
        assert (tight["request_limit"], tight["request_limit_override"]) == (None, None)

        for prefix in ("c0", "c1"):
            _wait(sdk["loose"], _submit(sdk["loose"], prefix), "in_progress")
        assert _refusal(sdk["loose"], "c2") == (
            "token_limit_exceeded",
            f"Enqueued token limit reached for {MODEL} in organization loose. "
            f"Limit: {looser:,} enqueued tokens. {RETRY}",
        )
        assert _refusal(sdk["tight"], "c3") == (
            "token_limit_exceeded",
            f"Enqueued token limit reached for {MODEL} in organization tight. "
            f"Limit: {per_batch - 1:,} enqueued tokens. {RETRY}",
        )
        _wait(sdk["plain"], _submit(sdk["plain"], "c4"), "in_progress")
        assert _refusal(sdk["plain"], "c5") == (
            "token_limit_exceeded",
            f"Enqueued token limit reached for {MODEL} in organization plain. "
            f"Limit: {default:,} enqueued tokens. {RETRY}",
        )

        # Tokens back to the default, a request limit of its own: the request limit refuses.
        reset = ["projects", "limit", "tight", MODEL, "--tokens", "default", "--requests", "5"]
        assert main([*reset, *cli]) == 0
        assert capsys.readouterr().out == (
            f"tight on {MODEL}: {default:,} tokens (default), 5 requests (own)\n"
        )
        assert _refusal(sdk["tight"], "c6") == (
            "request_limit_exceeded",
            f"Enqueued request limit reached for {MODEL} in organization tight. "
            f"Limit: 5 enqueued requests. {RETRY}",
        )
        assert main(["projects", "limits", "tight", "--json", *cli]) == 0
        listed = {r["model"]: r for r in orjson.loads(capsys.readouterr().out)}
        assert listed[MODEL] == {
            "object": "project.enqueued_limits",
            "project_id": tight["project_id"],
            "project_name": "tight",
            "model": MODEL,
            "token_limit": default,
            "request_limit": 5,
            "token_limit_override": None,
            "request_limit_override": 5,
        }
        assert all(r["token_limit"] == default for r in listed.values())
        # Both back to the default: the row goes, the project is like any other.
        admin.post(
            "/admin/projects/tight/limits",
            body={"model": MODEL, "request_limit": None},
            cast_to=dict,
        )
        assert main(["projects", "limits", "tight", *cli]) == 0
        table = capsys.readouterr().out
        assert f"{default:,} tokens (default)" in table and "(own)" not in table
        _wait(sdk["tight"], _submit(sdk["tight"], "c7"), "in_progress")

        # Only an admin sets or reads them; a bad limit or an unknown project is refused.
        member = sdk["loose"]
        with pytest.raises(openai.PermissionDeniedError):
            member.post(
                "/admin/projects/loose/limits",
                body={"model": MODEL, "token_limit": 10**9},
                cast_to=dict,
            )
        with pytest.raises(openai.PermissionDeniedError):
            member.get("/admin/projects/loose/limits", cast_to=dict)
        with pytest.raises(openai.BadRequestError):
            admin.post(
                "/admin/projects/loose/limits",
                body={"model": MODEL, "token_limit": -1},
                cast_to=dict,
            )
        with pytest.raises(openai.NotFoundError):
            admin.get("/admin/projects/nobody/limits", cast_to=dict)
        as_member = ["--base-url", server.base_url, "--api-key", keys["loose"]]
        assert main(["projects", "limit", "loose", MODEL, "--tokens", "1", *as_member]) == 1
        assert "admin key" in capsys.readouterr().err
        assert main(["projects", "limit", "loose", MODEL, *cli]) == 1
        assert "--tokens or --requests" in capsys.readouterr().err
        with session_scope(limited) as session:
            loose_id = ensure_project(session, "loose").id
            assert enqueued.limits(session, limited, loose_id, MODEL) == (looser, None)
        for client in sdk.values():
            client.close()
