"""Results while a batch runs: `GET /v1/batches/{id}/results` and a running Message Batch's
`results`, on SQLite and PostgreSQL.

A scripted worker (`tests.batch_sim`) records chunks shard by shard, out of shard order, while
clients follow with the cursor through the OpenAI SDK and raw HTTP; the housekeeping loop
of the real app finalizes the batch.
"""

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from anthropic.types import MessageParam
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

from app.config import Settings
from app.services.jsonl import iter_lines
from app.storage import storage_for
from tests import batch_sim
from tests.harness import RunningServer, running_server

ADMIN_KEY = "sk-admin-partial-results"


@pytest.fixture
def server(settings: Settings, keys: dict[str, str]) -> Iterator[RunningServer]:
    small_shards = {"admin_key": ADMIN_KEY, "shard_lines": 4}
    with running_server(settings.model_copy(update=small_shards)) as running:
        yield running


def sdk(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def results(client: openai.OpenAI, batch_id: str, **params: Any) -> dict[str, Any]:
    response = client.get(
        f"/batches/{batch_id}/results", cast_to=httpx.Response, options={"params": params}
    )
    page: dict[str, Any] = response.json()
    return page


def follow(client: openai.OpenAI, batch_id: str, cursor: str | None, limit: int) -> Any:
    """Every page from `cursor` until `has_more` is false: (lines, last cursor, last page)."""
    lines: list[dict[str, Any]] = []
    while True:
        page = results(client, batch_id, limit=limit, **({"after": cursor} if cursor else {}))
        lines += page["data"]
        cursor = page["last_id"]
        if not page["has_more"]:
            return lines, cursor, page


def record(settings: Settings, claim: batch_sim.Claim, sequence: int, lines: Any) -> list[Any]:
    """Records a chunk of the claimed shard's input `lines` (numbers); returns their outputs."""
    storage = storage_for(str(settings.storage_dir))
    inputs = dict(
        iter_lines(storage, claim.input_key, claim.byte_start, claim.byte_end, claim.first_line)
    )
    outputs = []
    for number in lines:
        request = orjson.loads(inputs[number])
        status, body = batch_sim.default_responder(request["custom_id"], request["body"])
        outputs.append((number, batch_sim.output_line(request["custom_id"], status, body)))
    assert batch_sim.write_chunk(settings, claim, sequence, outputs, done=False)
    return [output for _n, output in outputs]


def shard_lines(claim: batch_sim.Claim) -> list[int]:
    return list(range(claim.first_line, claim.first_line + 4))


def wait_for(check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def start(client: openai.OpenAI, lines: bytes) -> str:
    f = client.files.create(file=("in.jsonl", lines), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_for(lambda: client.batches.retrieve(batch.id).status == "in_progress")
    return batch.id


def ids(lines: list[dict[str, Any]]) -> list[str]:
    return [line["id"] for line in lines]


def test_follow_a_running_batch_then_its_files(server: RunningServer, keys: dict[str, str]) -> None:
    settings = server.settings
    alpha, beta, admin = (sdk(server, k) for k in (keys["alpha"], keys["beta"], ADMIN_KEY))
    batch_id = start(alpha, batch_sim.requests_file(10))

    empty = results(alpha, batch_id)
    assert (empty["data"], empty["has_more"], empty["complete"]) == ([], False, False)

    first = batch_sim.claim_shard(settings, "sim", batch_id)
    assert first is not None
    recorded = record(settings, first, 0, shard_lines(first)[:2])
    seen, cursor, last = follow(alpha, batch_id, empty["last_id"], limit=1)
    assert seen == recorded and last["complete"] is False

    # A later shard lands, then the first shard again: its new chunk sorts before the cursor's
    # last shard, and is still read once.
    second = batch_sim.claim_shard(settings, "sim", batch_id)
    assert second is not None and second.shard_id != first.shard_id
    recorded += record(settings, second, 0, shard_lines(second)[1:])
    recorded += record(settings, first, 1, shard_lines(first)[2:])
    more, cursor, last = follow(alpha, batch_id, cursor, limit=2)
    assert sorted(ids(seen + more)) == sorted(ids(recorded))
    assert len(set(ids(seen + more))) == len(seen + more)
    nothing_new = results(alpha, batch_id, after=cursor)
    assert nothing_new["data"] == [] and nothing_new["last_id"] == cursor
    assert sorted(ids(follow(alpha, batch_id, None, limit=100)[0])) == sorted(ids(recorded))

    with pytest.raises(openai.NotFoundError):
        beta.get(f"/batches/{batch_id}/results", cast_to=httpx.Response)
    assert sorted(ids(follow(admin, batch_id, None, limit=100)[0])) == sorted(ids(recorded))

    batch_sim.run_batch(settings, batch_id)  # the last shard, to its end
    record(settings, second, 1, shard_lines(second)[:1])
    for claim, sequence in ((first, 2), (second, 2)):
        assert batch_sim.write_chunk(settings, claim, sequence, [], done=True)
    done = wait_for(lambda: (b := alpha.batches.retrieve(batch_id)).status == "completed" and b)

    restart = results(alpha, batch_id, after=cursor, limit=3)
    assert restart["complete"] is True and restart["restarted"] is True
    rest, _cursor, last = follow(alpha, batch_id, restart["last_id"], limit=3)
    after_end = restart["data"] + rest
    assert last["complete"] is True and last["restarted"] is False
    files = b"".join(
        alpha.files.content(i).content for i in (done.output_file_id, done.error_file_id) if i
    )
    in_files = [orjson.loads(line) for line in files.splitlines()]
    assert after_end == in_files and len(in_files) == 10
    assert set(ids(recorded)) <= set(ids(in_files))
    fresh, _cursor, last = follow(alpha, batch_id, None, limit=4)
    assert fresh == in_files and last["restarted"] is False


def test_bad_cursor_is_refused(server: RunningServer, keys: dict[str, str]) -> None:
    alpha = sdk(server, keys["alpha"])
    batch_id = start(alpha, batch_sim.requests_file(2))
    with pytest.raises(openai.BadRequestError) as refused:
        alpha.get(
            f"/batches/{batch_id}/results",
            cast_to=httpx.Response,
            options={"params": {"after": "not-a-cursor"}},
        )
    assert "after" in str(refused.value)


def test_running_message_batch_results(server: RunningServer, keys: dict[str, str]) -> None:
    settings = server.settings
    with anthropic.Anthropic(base_url=server.url, api_key=keys["alpha"], max_retries=0) as alpha:
        message: MessageParam = {"role": "user", "content": "hi"}
        params: MessageCreateParamsNonStreaming = {
            "model": batch_sim.MODEL,
            "max_tokens": 4,
            "messages": [message],
        }
        created = alpha.messages.batches.create(
            requests=[{"custom_id": f"m-{i}", "params": params} for i in range(6)]
        )
        claim = wait_for(lambda: batch_sim.claim_shard(settings, "sim", created.id))
    url = f"{server.url}/v1/messages/batches/{created.id}/results"
    http = httpx.Client(headers={"x-api-key": keys["alpha"]}, timeout=60)
    record(settings, claim, 0, shard_lines(claim)[:3])

    response = http.get(url)
    assert response.status_code == 200
    assert response.headers["overnight-results-complete"] == "false"
    lines = [orjson.loads(line) for line in response.content.splitlines()]
    assert [line["custom_id"] for line in lines] == ["m-0", "m-1", "m-2"]
    assert {line["result"]["type"] for line in lines} <= {"succeeded", "errored"}

    record(settings, claim, 1, shard_lines(claim)[3:])
    cursor = response.headers["overnight-results-cursor"]
    following = http.get(url, params={"after": cursor})
    assert [orjson.loads(line)["custom_id"] for line in following.content.splitlines()] == ["m-3"]
    assert following.headers["overnight-results-has-more"] == "false"

    other = httpx.get(url, headers={"x-api-key": keys["beta"]})
    assert other.status_code == 404 and other.json()["type"] == "error"

    assert batch_sim.write_chunk(settings, claim, 2, [], done=True)
    batch_sim.run_batch(settings, created.id)
    wait_for(lambda: http.get(url).headers["overnight-results-complete"] == "true")
    ended = http.get(url)
    assert sorted(orjson.loads(line)["custom_id"] for line in ended.content.splitlines()) == [
        f"m-{i}" for i in range(6)
    ]
    restarted = http.get(url, params={"after": following.headers["overnight-results-cursor"]})
    assert restarted.headers["overnight-results-restarted"] == "true"
    assert len(restarted.content.splitlines()) == 6
