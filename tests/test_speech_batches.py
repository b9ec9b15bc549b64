"""Audio batches in the service, on the real engine with a tiny random Whisper.

The transcripts are noise (random weights: content is not checked); what is checked is the
request path (a `file_url` as data: or http(s), vLLM's batch wrapper, its errors), the
lines' shapes, and that a worker fetches only what the operator allows: the loopback file
server's host is allowed (with private addresses) for this deployment, its other name is
not, and no redirect is followed.
"""

from pathlib import Path

import orjson
import pytest

from app.config import DEFAULT_MODELS, ServedModel
from app.endpoints import SPEECH, TRANSCRIPTIONS, TRANSLATIONS
from tests.engine_fixtures import deployment, jsonl, line, results, start_batch, wait_status
from tests.file_server import Files
from tests.tiny_whisper import build_tiny_whisper, tone_wav

pytestmark = pytest.mark.engine

WHISPER = "whisper"
# The file server's 127.0.0.1 may be fetched from; its other name, localhost, may not.
MEDIA = {"allowed_media_domains": ["127.0.0.1"], "media_allow_private": True}
MEDIA_ENV: dict[str, str | None] = {
    "OVERNIGHT_ALLOWED_MEDIA_DOMAINS": '["127.0.0.1"]',
    "OVERNIGHT_MEDIA_ALLOW_PRIVATE": "1",
}
DATA_WAV = "data:audio/wav;base64,UklGRigAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQQAAAAAAP9/"


def test_transcription_and_translation_batches(tmp_path: Path, file_server: str) -> None:
    folder = build_tiny_whisper(tmp_path / "whisper")
    speech = ServedModel(name=WHISPER, endpoints=list(SPEECH), source=str(folder))
    Files.served["/tone.wav"] = Files.served["/elsewhere.wav"] = tone_wav()
    wav_url = f"{file_server}/tone.wav"
    other_name = file_server.replace("127.0.0.1", "localhost")
    Files.redirects["/hop.wav"] = f"{other_name}/elsewhere.wav"
    models = [*DEFAULT_MODELS, speech]
    with deployment("sqlite", tmp_path / "deployment", models=models, **MEDIA) as running:
        args = ["--model", str(folder), "--served-model-name", WHISPER, "--enforce-eager"]
        running.start_worker("whisper", args, env=MEDIA_ENV).wait_ready()
        client = running.client()
        asked = {"model": WHISPER, "response_format": "json"}
        transcribe = [
            line("data-url", TRANSCRIPTIONS, {**asked, "file_url": DATA_WAV}),
            line("http-url", TRANSCRIPTIONS, {**asked, "file_url": wav_url, "language": "en"}),
            line("ftp-url", TRANSCRIPTIONS, {**asked, "file_url": "ftp://example.com/a.wav"}),
            line("upload", TRANSCRIPTIONS, {**asked, "file": "a.wav", "file_url": wav_url}),
            line("redirect", TRANSCRIPTIONS, {**asked, "file_url": f"{file_server}/hop.wav"}),
        ]
        translate = {"model": WHISPER, "file_url": wav_url, "language": "it", "to_language": "en"}
        transcribed = start_batch(client, jsonl(transcribe), endpoint=TRANSCRIPTIONS)
        translated = start_batch(
            client, jsonl([line("t", TRANSLATIONS, translate)]), endpoint=TRANSLATIONS
        )
        by_id = results(client, wait_status(client, transcribed, "completed", timeout=180))
        [only] = results(client, wait_status(client, translated, "completed", timeout=180)).values()
        # A speech model serves no chat: validation says so with the line.
        chat = {"model": WHISPER, "messages": [{"role": "user", "content": "hi"}]}
        refused = start_batch(client, jsonl([line("c", "/v1/chat/completions", chat)]))
        failed = wait_status(client, refused, "failed")
        # A host the operator did not allow: the line is refused, the URL never fetched.
        secret = {**asked, "file_url": f"{other_name}/secret.wav"}
        private = start_batch(client, jsonl([line("s", TRANSCRIPTIONS, secret)]), TRANSCRIPTIONS)
        not_fetched = wait_status(client, private, "failed")
        client.close()
    for custom_id in ("data-url", "http-url"):
        response = by_id[custom_id]["response"]
        assert response["status_code"] == 200
        assert isinstance(response["body"]["text"], str) and "usage" in response["body"]
    ftp = by_id["ftp-url"]["response"]
    assert ftp["status_code"] == 400 and "Unsupported URL scheme" in orjson.dumps(ftp).decode()
    assert by_id["upload"]["response"]["status_code"] == 400
    assert only["response"]["status_code"] == 200
    assert isinstance(only["response"]["body"]["text"], str)
    assert failed.errors is not None
    assert [(e.code, e.line) for e in failed.errors.data or []] == [("model_endpoint_mismatch", 1)]
    assert not_fetched.errors is not None
    assert [(e.code, e.line) for e in not_fetched.errors.data or []] == [
        ("media_url_not_allowed", 1)
    ]
    # The redirect's answer is not followed to a host that is not allowed.
    assert by_id["redirect"]["response"]["status_code"] != 200
    assert "/hop.wav" in Files.requested
    assert not {"/secret.wav", "/elsewhere.wav"} & set(Files.requested)
