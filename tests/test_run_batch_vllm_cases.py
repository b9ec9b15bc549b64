"""vLLM 0.32's own run_batch test cases, run against `overnight run-batch`.

The cases of vLLM's `tests/entrypoints/launchers/test_run_batch.py`: the same JSONL inputs,
flags and assertions (every output line validated by vLLM's own `BatchRequestOutput`), with
the bundled models in place of vLLM's hub models, and greedy chat cases (`GREEDY`: a sampled
answer's length is chance). The output file is opened before the run,
as vLLM's tests do, and read through that handle. Cases on the same model with the same flags
run as one input file, each test reading its own lines of the output (both runners keep the
input's order).

`OVERNIGHT_VLLM_CASES_RUNNER=vllm` runs the same cases against vLLM's own runner
(`python -m vllm.entrypoints.openai.run_batch`) on this machine, for comparison; checks that
are ours only (error lines, order, a clean exit) are skipped then.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.engine_fixtures import ENGINE_ENV, REPO
from tests.file_server import Files, serving_files
from tests.tiny_whisper import build_tiny_whisper, tone_wav
from worker.dtype import worker_dtype
from worker.models import SMOLLM2_AMX_DTYPE, minilm_dir

pytestmark = pytest.mark.engine


@cache
def smollm2_dtype() -> str:
    """The worker's dtype for SmolLM2 here; asked of vLLM's platform (seconds of CPU to
    import) when a case runs, not at collection, which every xdist worker runs."""
    return worker_dtype(None, SMOLLM2_AMX_DTYPE).dtype


RUNNER = os.environ.get("OVERNIGHT_VLLM_CASES_RUNNER", "overnight")
OURS = RUNNER == "overnight"

CHAT_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"
RERANKER_MODEL_NAME = EMBEDDING_MODEL_NAME
REASONING_MODEL_NAME = CHAT_MODEL_NAME
ENGINE_FLAGS = ["--enforce-eager"]
# SmolLM2 allows 8k tokens; 2k keeps its KV cache small (MiniLM allows 256 by itself).
CHAT_MAX_MODEL_LEN = 2048


def _jsonl(requests: list[dict[str, Any]], end: str = "") -> str:
    return "\n".join(json.dumps(r) for r in requests) + end


def _chat(custom_id: str, system: str, model: str = CHAT_MODEL_NAME, **extra: Any) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello world!"}]
    body = {**extra, "model": model, "messages": messages, "max_tokens": 1000}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


HELPFUL, UNHELPFUL = "You are a helpful assistant.", "You are an unhelpful assistant."
INPUT_BATCH = _jsonl(
    [
        _chat("request-1", HELPFUL),
        _chat("request-2", UNHELPFUL),
        _chat("request-3", UNHELPFUL, model="NonExistModel"),
        {**_chat("request-4", UNHELPFUL), "url": "/bad_url"},
        _chat("request-5", UNHELPFUL, stream="True"),
    ]
)
_invalid = _chat("request-1", HELPFUL)
INVALID_INPUT_BATCH = _jsonl(
    [
        {"invalid_field": _invalid.pop("custom_id"), **_invalid},
        _chat("request-2", UNHELPFUL),
    ]
)


def _embed(custom_id: str, text: str, model: str = EMBEDDING_MODEL_NAME) -> dict:
    body = {"model": model, "input": text}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


INPUT_EMBEDDING_BATCH = _jsonl(
    [
        _embed("request-1", HELPFUL),
        _embed("request-2", UNHELPFUL),
        _embed("request-3", "Hello world!"),
        _embed("request-4", "Hello world!", model="NonExistModel"),
    ]
)

DOCUMENTS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]
QUESTION = "What is the capital of France?"


def _scoring(custom_id: str, url: str, question_field: str) -> dict:
    body = {"model": RERANKER_MODEL_NAME, question_field: QUESTION, "documents": DOCUMENTS}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


INPUT_SCORE_BATCH = _jsonl(
    [_scoring("request-1", "/score", "queries"), _scoring("request-2", "/v1/score", "queries")]
)
INPUT_RERANK_BATCH = _jsonl(
    [
        _scoring("request-1", "/rerank", "query"),
        _scoring("request-2", "/v1/rerank", "query"),
        _scoring("request-2", "/v2/rerank", "query"),
    ]
)


def _reasoning(custom_id: str, question: str) -> dict:
    messages = [{"role": "system", "content": HELPFUL}, {"role": "user", "content": question}]
    body = {"model": REASONING_MODEL_NAME, "messages": messages}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


INPUT_REASONING_BATCH = _jsonl(
    [_reasoning("request-1", "Solve this math problem: 2+2=?"), _reasoning("request-2", QUESTION)]
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
INPUT_TOOL_CALLING_BATCH = json.dumps(
    {
        "custom_id": "request-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": REASONING_MODEL_NAME,
            "messages": [{"role": "user", "content": "What is the weather in San Francisco?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "max_tokens": 1000,
        },
    }
)


MINIMAL_WAV_BASE64 = "UklGRigAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQQAAAAAAP9/"
# vLLM's cases name whisper-large-v3 and whisper-small; here one tiny random Whisper serves both.
SPEECH_LARGE_MODEL_NAME = "whisper"
SPEECH_SMALL_MODEL_NAME = "whisper"


def _speech(url: str, body: dict[str, Any]) -> str:
    return _jsonl([{"custom_id": "request-1", "method": "POST", "url": url, "body": body}], "\n")


INPUT_TRANSCRIPTION_BATCH = _speech(
    "/v1/audio/transcriptions",
    {
        "model": SPEECH_LARGE_MODEL_NAME,
        "file_url": f"data:audio/wav;base64,{MINIMAL_WAV_BASE64}",
        "response_format": "json",
    },
)


def transcription_http_batch(audio_url: str) -> str:
    body = {
        "model": SPEECH_LARGE_MODEL_NAME,
        "file_url": audio_url,
        "language": "en",
        "response_format": "json",
    }
    return _speech("/v1/audio/transcriptions", body)


def translation_batch(audio_url: str) -> str:
    body = {
        "model": SPEECH_SMALL_MODEL_NAME,
        "file_url": audio_url,
        "response_format": "text",
        "language": "it",
        "to_language": "en",
        "temperature": 0.0,
    }
    return _speech("/v1/audio/translations", body)


@dataclass
class Models:
    """Where each bundled model is for vLLM's runner (ours takes the bundled names)."""

    data_dir: Path
    chat_dir: Path
    whisper_dir: Path

    def args(self, name: str, max_model_len: int) -> list[str]:
        flags = ["--max-model-len", str(max_model_len)] if name == CHAT_MODEL_NAME else []
        if name == SPEECH_LARGE_MODEL_NAME:
            return ["--model", str(self.whisper_dir), "--served-model-name", name]
        if OURS:
            return ["--model", name, *flags]
        if name == CHAT_MODEL_NAME:
            # The dtype ours picks for the bundled SmolLM2 on this machine.
            loaded = ["--model", str(self.chat_dir), "--dtype", smollm2_dtype()]
        else:
            loaded = ["--model", str(minilm_dir())]
        return [*loaded, "--served-model-name", name, *flags]


@pytest.fixture(scope="module")
def models(
    models_data_dir: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Models:
    whisper = build_tiny_whisper(tmp_path_factory.mktemp("whisper"))
    return Models(models_data_dir, smollm2, whisper)


@dataclass
class Run:
    returncode: int
    contents: str
    stderr: str

    def lines(self) -> Iterator[str]:
        return iter(self.contents.strip().split("\n"))


@dataclass(frozen=True)
class Case:
    """One of vLLM's cases: its input, the model it names and the runner's extra flags."""

    data: str
    model: str
    flags: tuple[str, ...] = ()
    max_model_len: int = CHAT_MAX_MODEL_LEN  # the chat model's
    # A case about the whole file (an empty one, one that fails the run) runs by itself.
    alone: bool = False


# The chat cases set no temperature. Sampled, an answer's length turns on which requests the
# engine happens to step together: the completions case's two answers took 17 and 7 tokens in
# two runs side by side and ran to their 1,000-token limit in the third (139 s of CPU against
# 24 s; in both full runs of one day). vLLM's own switch makes the model's default sampling
# greedy, so each chat case asks the same tokens every time (5 and 26 for completions).
GREEDY = ("--override-generation-config", '{"temperature": 0}')


def cases(file_server: str) -> dict[str, Case]:
    """Every case, in the order the tests below read them."""
    audio = f"{file_server}/mary_had_lamb.wav"
    tools = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", *GREEDY)
    return {
        "empty": Case("", EMBEDDING_MODEL_NAME, alone=True),
        "completions": Case(INPUT_BATCH, CHAT_MODEL_NAME, GREEDY),
        "invalid": Case(INVALID_INPUT_BATCH, CHAT_MODEL_NAME, alone=True),
        "embeddings": Case(INPUT_EMBEDDING_BATCH, EMBEDDING_MODEL_NAME),
        "score": Case(INPUT_SCORE_BATCH, RERANKER_MODEL_NAME),
        "rerank": Case(INPUT_RERANK_BATCH, RERANKER_MODEL_NAME),
        # The case sets no max_tokens, and SmolLM2 answers its second question until the
        # context is full: at 2,048 tokens that took 3.5 minutes here, at 512 it takes seconds.
        "reasoning": Case(
            INPUT_REASONING_BATCH,
            REASONING_MODEL_NAME,
            ("--reasoning-parser", "qwen3", *GREEDY),
            max_model_len=512,
        ),
        "tools": Case(INPUT_TOOL_CALLING_BATCH, REASONING_MODEL_NAME, tools),
        "transcription": Case(INPUT_TRANSCRIPTION_BATCH, SPEECH_LARGE_MODEL_NAME),
        "transcription_http": Case(transcription_http_batch(audio), SPEECH_LARGE_MODEL_NAME),
        "translation": Case(translation_batch(audio), SPEECH_SMALL_MODEL_NAME),
    }


def by_engine(named: dict[str, Case]) -> list[list[str]]:
    """The cases by the run they share: one run for each model and flags, whole-file cases
    alone. Most of a run's cost is its engine's start: the MiniLM and Whisper cases made six
    starts, and make two."""
    groups: dict[object, list[str]] = {}
    for name, case in named.items():
        key = name if case.alone else (case.model, case.flags, case.max_model_len)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def joined(group: list[Case]) -> Case:
    """One case of the group's inputs, one after the other."""
    if len(group) == 1:
        return group[0]
    data = "".join(case.data.rstrip("\n") + "\n" for case in group)
    return Case(data, group[0].model, group[0].flags, group[0].max_model_len)


@dataclass(frozen=True)
class CaseRun:
    """A case's own lines of the run it shares (the output keeps the input's order)."""

    shared: Future[Run]
    first: int
    count: int | None  # None: the whole run is the case's

    def result(self) -> Run:
        run = self.shared.result()
        if self.count is None:
            return run
        lines = run.contents.splitlines()[self.first : self.first + self.count]
        return Run(run.returncode, "\n".join(lines), run.stderr)


Runs = dict[str, CaseRun]

# Runners started ahead, two at a time: most of a runner's life is its engine's start, mostly
# one process importing at a time, so two overlap well on two cores.
RUNS_AT_ONCE = 2


@pytest.fixture(scope="module")
def runs(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Every case's run, started ahead in the tests' order; each test waits for its own."""
    Files.served["/mary_had_lamb.wav"] = tone_wav()
    with serving_files() as url, ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        named = cases(url)
        started: Runs = {}
        for names in by_engine(named):
            case = joined([named[name] for name in names])
            shared = pool.submit(run_batch, models, tmp_path_factory.mktemp(names[0]), case)
            first = 0
            for name in names:
                count = len(named[name].data.splitlines()) if len(names) > 1 else None
                started[name] = CaseRun(shared, first, count)
                first += count or 0
        yield started
        for run in started.values():
            run.shared.cancel()


def run_batch(models: Models, tmp_path: Path, case: Case) -> Run:
    """The runner on the case's input, the output read through a handle opened before the run."""
    if OURS:
        command = [sys.executable, "-m", "app.cli", "run-batch"]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch"]
    source = tmp_path / "input.jsonl"
    source.write_text(case.data)
    env = {**os.environ, **ENGINE_ENV, "OVERNIGHT_DATA_DIR": str(models.data_dir)}
    with tempfile.NamedTemporaryFile("r", dir=tmp_path, suffix=".jsonl") as output_file:
        model = models.args(case.model, case.max_model_len)
        args = ["-i", str(source), "-o", output_file.name, *model]
        proc = subprocess.run(
            [*command, *args, *ENGINE_FLAGS, *case.flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path if OURS else REPO,
        )
        return Run(proc.returncode, output_file.read(), proc.stderr)


def validated(run: Run) -> list[dict[str, Any]]:
    """Every line through vLLM's `BatchRequestOutput` (it raises if the shape is wrong)."""
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    assert run.returncode == 0, run.stderr[-3000:]
    for line in run.lines():
        BatchRequestOutput.model_validate_json(line)
    return [json.loads(line) for line in run.lines()]


def assert_clean_exit(run: Run) -> None:
    if OURS:
        assert "Traceback" not in run.stderr and "leaked" not in run.stderr, run.stderr[-3000:]


def test_empty_file(runs: Runs) -> None:
    run = runs["empty"].result()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.contents.strip() == ""


def test_completions(runs: Runs) -> None:
    run = runs["completions"].result()
    lines = validated(run)
    assert_clean_exit(run)
    if OURS:  # vLLM's line for line: answers, then one error line per bad line, in order
        assert [line["custom_id"] for line in lines] == [f"request-{i}" for i in range(1, 6)]
        statuses = [line["response"]["status_code"] for line in lines]
        assert statuses == [200, 200, 404, 400, 400]
        for line in lines[2:]:
            assert line["response"]["body"] is None and line["error"]["error"]["message"]
        assert "NonExistModel" in lines[2]["error"]["error"]["message"]
        assert "/bad_url" in lines[3]["error"]["error"]["message"]


def test_completions_invalid_input(runs: Runs) -> None:
    run = runs["invalid"].result()
    assert run.returncode != 0
    if OURS:
        assert "line 1:" in run.stderr and "custom_id" in run.stderr


def test_embeddings(runs: Runs) -> None:
    run = runs["embeddings"].result()
    lines = validated(run)
    assert_clean_exit(run)
    if OURS:
        assert [line["response"]["status_code"] for line in lines] == [200, 200, 200, 404]


@pytest.mark.parametrize("case", ["score", "rerank"])
def test_score(runs: Runs, case: str) -> None:
    run = runs[case].result()
    for line in validated(run):
        assert line["error"] is None


def test_reasoning_parser(runs: Runs) -> None:
    run = runs["reasoning"].result()
    for line in validated(run):
        assert line["error"] is None
        reasoning = line["response"]["body"]["choices"][0]["message"]["reasoning"]
        assert reasoning is not None
        assert len(reasoning) > 0


def test_tool_calling(runs: Runs) -> None:
    run = runs["tools"].result()
    for line in validated(run):
        assert line["error"] is None
        message = line["response"]["body"]["choices"][0]["message"]
        tool_calls = message.get("tool_calls")
        assert isinstance(tool_calls, list) and len(tool_calls) > 0
        for tool_call in tool_calls:
            assert {"id", "type", "function"} <= set(tool_call)
            assert tool_call["type"] == "function"
            assert {"name", "arguments"} <= set(tool_call["function"])
            assert tool_call["function"]["name"] == "get_current_weather"


# Audio: vLLM's checks of the line shape hold; its checks of the transcript ("Mary had a
# little lamb") cannot with a random model, and vLLM's audio file is served locally here.


def answered_bodies(run: Run) -> list[dict[str, Any]]:
    """vLLM's checks common to its audio cases: valid lines, no error, a body."""
    bodies = []
    for line in validated(run):
        assert line["error"] is None
        assert line["response"]["body"] is not None
        bodies.append(line["response"]["body"])
    return bodies


def test_transcription(runs: Runs) -> None:
    run = runs["transcription"].result()
    for body in answered_bodies(run):
        assert "text" in body and "usage" in body


def test_transcription_http_url(runs: Runs) -> None:
    run = runs["transcription_http"].result()
    for body in answered_bodies(run):
        assert "text" in body and "usage" in body
        assert isinstance(body["text"], str)  # the transcript itself: not with random weights


def test_translation(runs: Runs) -> None:
    run = runs["translation"].result()
    for body in answered_bodies(run):
        assert isinstance(body["text"], str)
