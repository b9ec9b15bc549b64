"""Audio batches in the service, on the real engine with a tiny random Whisper.

The transcripts are noise (random weights: content is not checked); what is checked is the
request path (a `file_url` as data: or http(s), vLLM's batch wrapper, its errors) and the
lines' shapes.
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
DATA_WAV = "data:audio/wav;base64,UklGRigAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQQAAAAAAP9/"


def test_transcription_and_translation_batches(tmp_path: Path, file_server: str) -> None:
    folder = build_tiny_whisper(tmp_path / "whisper")
    speech = ServedModel(name=WHISPER, endpoints=list(SPEECH), source=str(folder))
    Files.served["/tone.wav"] = tone_wav()
    wav_url = f"{file_server}/tone.wav"
    with deployment("sqlite", tmp_path / "deployment", models=[*DEFAULT_MODELS, speech]) as running:
        args = ["--model", str(folder), "--served-model-name", WHISPER, "--enforce-eager"]
        running.start_worker("whisper", args).wait_ready()
        client = running.client()
        asked = {"model": WHISPER, "response_format": "json"}
        transcribe = [
            line("data-url", TRANSCRIPTIONS, {**asked, "file_url": DATA_WAV}),
            line("http-url", TRANSCRIPTIONS, {**asked, "file_url": wav_url, "language": "en"}),
            line("ftp-url", TRANSCRIPTIONS, {**asked, "file_url": "ftp://example.com/a.wav"}),
            line("upload", TRANSCRIPTIONS, {**asked, "file": "a.wav", "file_url": wav_url}),
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
