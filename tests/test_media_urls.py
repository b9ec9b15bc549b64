"""Media URLs a tenant points workers at: refused at validation with the line, and again by
the worker, unless the operator allows the host and it is not on a private address.

The real app under uvicorn and, for the worker, the scripted engine; the fetch itself is
vLLM's, so tests/test_speech_batches.py shows on the real engine that a refused URL is never
fetched.
"""

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest

from app.config import DEFAULT_MODELS, ServedModel, Settings
from app.endpoints import SPEECH, TRANSCRIPTIONS
from app.services.media_urls import MediaRule, media_urls
from tests.engine_fixtures import chat_line, jsonl, line, results, start_batch, wait_status
from tests.fake_engine import FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, running_server

METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
PIXEL = "data:image/png;base64,iVBORw0KGgo="  # never decoded: validation reads no bytes
WAV = "data:audio/wav;base64,UklGRigAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQQAAAAAAP9/"
WHISPER = "whisper"
REFUSED = "media_url_not_allowed"


def looking_at(*urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in it?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]


def image_line(custom_id: str, *urls: str) -> bytes:
    return chat_line(custom_id, messages=looking_at(*urls))


@contextmanager
def api(settings: Settings, **update: Any) -> Iterator[tuple[Settings, openai.OpenAI]]:
    with running_server(fast(settings, **update)) as server, sdk(server) as client:
        yield server.settings, client


def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="-", max_retries=0)


def refusals(batch: openai.types.Batch) -> list[tuple[str | None, int | None, str | None]]:
    assert batch.errors is not None
    return [(e.code, e.line, e.param) for e in batch.errors.data or []]


def test_media_urls_are_found_where_vllm_reads_them() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "see http://example.com/a.png"},  # text, not media
            {"role": "user", "content": [{"type": "input_image", "image_url": "http://b/"}]},
            {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "http://c/"}}]},
        ],
        "file_url": "http://d/",
        "input": [[1, 2, 3]],
    }
    assert sorted(media_urls(body)) == [
        ("file_url", "http://d/"),
        ("messages[1].content[0].image_url", "http://b/"),
        ("messages[2].content[0].audio_url", "http://c/"),
    ]
    deep: Any = {"video_url": "http://e/"}
    for _ in range(5000):
        deep = [deep]
    assert [url for _, url in media_urls(deep)] == ["http://e/"]


@pytest.mark.parametrize(
    "url",
    [
        METADATA,
        "HTTP://127.0.0.1:9/x",
        "http://2130706433/",  # 127.0.0.1, written as one number
        "http://[::ffff:169.254.169.254]/",
        "http://localhost/x",
        "http://allowed.example\\@127.0.0.1/",  # parsers disagree on its host
        "http://user@allowed.example/",
        "http://allowed..example/",  # no name at all: refused, not a crash
    ],
)
def test_urls_that_could_reach_a_private_address_are_refused_even_for_listed_hosts(
    url: str,
) -> None:
    hosts = {"127.0.0.1", "2130706433", "::ffff:169.254.169.254", "localhost", "169.254.169.254"}
    listed = MediaRule(frozenset(hosts | {"allowed.example"}), allow_private=False)
    assert listed.refusal(url) is not None
    assert MediaRule(frozenset(), allow_private=True).refusal(url) is not None
    assert MediaRule(frozenset({"*"}), allow_private=False).refusal(url) is not None


def test_data_urls_and_schemes_vllm_does_not_fetch_are_left_alone() -> None:
    closed = MediaRule(frozenset(), allow_private=False)
    for url in (PIXEL, "DATA:audio/wav;base64,AAAA", "ftp://example.com/a.wav", "a.png"):
        assert closed.refusal(url) is None


def test_a_line_with_a_media_url_fails_validation_with_its_line(
    settings: Settings, file_server: str
) -> None:
    images = [
        chat_line("text"),
        image_line("inline", PIXEL),
        image_line("metadata", PIXEL, METADATA),
        image_line("loopback", f"{file_server}/cat.png"),
    ]
    speech = ServedModel(name=WHISPER, endpoints=list(SPEECH))
    transcribe = {"model": WHISPER, "file_url": f"{file_server}/a.wav"}
    audio = [
        line("inline", TRANSCRIPTIONS, {**transcribe, "file_url": WAV}),
        line("loopback", TRANSCRIPTIONS, transcribe),
    ]
    with api(settings, models=[*DEFAULT_MODELS, speech]) as (_, client):
        chat = wait_status(client, start_batch(client, jsonl(images)), "failed", "in_progress")
        heard = start_batch(client, jsonl(audio), endpoint=TRANSCRIPTIONS)
        transcriptions = wait_status(client, heard, "failed", "in_progress")
    assert refusals(chat) == [
        (REFUSED, 3, "body.messages[0].content[2].image_url"),
        (REFUSED, 4, "body.messages[0].content[1].image_url"),
    ]
    assert chat.errors is not None and chat.errors.data is not None
    assert "fetches no remote media" in (chat.errors.data[0].message or "")
    assert refusals(transcriptions) == [(REFUSED, 2, "body.file_url")]


@pytest.fixture
def private_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """`media.example.com` resolves to a private address (the only made-up answer)."""
    resolve = socket.getaddrinfo

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "media.example.com":
            return resolve("10.20.30.40", port, *args, **kwargs)
        return resolve(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.usefixtures("private_dns")
def test_an_allowed_host_on_a_private_address_is_refused_unless_private_is_allowed(
    settings: Settings,
) -> None:
    lines = [
        image_line("allowed-private", "https://media.example.com/cat.png"),
        image_line("loopback", "http://127.0.0.1:9/cat.png"),
        image_line("unlisted", "https://cdn.example.org/cat.png"),
    ]
    allowed = ["media.example.com", "127.0.0.1"]
    with api(settings, allowed_media_domains=allowed) as (_, client):
        failed = wait_status(client, start_batch(client, jsonl(lines)), "failed", "in_progress")
        assert [(code, line) for code, line, _ in refusals(failed)] == [
            (REFUSED, 1),
            (REFUSED, 2),
            (REFUSED, 3),
        ]
        assert failed.errors is not None and failed.errors.data is not None
        first, second, third = (e.message or "" for e in failed.errors.data)
        assert "resolves to 10.20.30.40, a loopback or private address" in first
        assert "OVERNIGHT_MEDIA_ALLOW_PRIVATE=1" in second
        assert "not a host this deployment fetches media from" in third
    opened = {"allowed_media_domains": allowed, "media_allow_private": True}
    with api(settings, **opened) as (_, client):
        admitted = start_batch(client, jsonl(lines[:2]))
        assert wait_status(client, admitted, "failed", "in_progress").status == "in_progress"


def test_a_worker_refuses_what_validation_let_through(settings: Settings) -> None:
    # Validated under a wider allowance than the worker has now (an operator narrowed it,
    # or the host moved): the worker answers the line 400 and the engine never sees it.
    lines = [chat_line("text"), image_line("loopback", "http://127.0.0.1:9/cat.png")]
    opened = {"allowed_media_domains": ["127.0.0.1"], "media_allow_private": True}
    engine = FakeEngine()
    with api(settings, **opened) as (served, client):
        batch_id = start_batch(client, jsonl(lines))
        wait_status(client, batch_id, "in_progress")
        closed = served.model_copy(update={"allowed_media_domains": []})
        with ThreadedWorker(closed, engine):
            by_id = results(client, wait_status(client, batch_id, "completed"))
    refused = by_id["loopback"]["response"]
    assert refused["status_code"] == 400
    error = refused["body"]["error"]
    assert (error["code"], error["param"]) == (REFUSED, "messages[0].content[1].image_url")
    assert by_id["text"]["response"]["status_code"] == 200
    assert [body["messages"][0]["content"] for _, body, _ in engine.calls] == ["hello text"]
