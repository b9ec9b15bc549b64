"""The worker's dtype rule (worker/dtype.py): each CPU kind's pick, from its /proc/cpuinfo text;
then, on the real engine here, that the pick answers correctly (embeddings as float32's,
capitals named) and that the worker shows it in its log and on the dashboard.

`python -m tests.test_dtype DTYPE OUT` writes raw vLLM's MiniLM embeddings in DTYPE of
SENTENCES to OUT (the reference, in a cold process as vLLM wants).
"""

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.engine_fixtures import (
    ENGINE_ENV,
    Deployment,
    chat_line,
    child_env,
    deployment,
    jsonl,
    line,
    results,
    smollm2_args,
    start_batch,
    wait_status,
)
from tests.reference_embeddings import SENTENCES
from worker.dtype import AUTO, BFLOAT16, FLOAT16, FLOAT32, for_cpu, worker_dtype
from worker.models import SMOLLM2_AMX_DTYPE

REPO = Path(__file__).resolve().parent.parent
MINILM = "all-MiniLM-L6-v2"
EMBEDDINGS = "/v1/embeddings"


def x86(*flags: str) -> str:
    common = "fpu vme de pse tsc msr pae mce cx8 apic sep sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma"
    return f"processor\t: 0\nvendor_id\t: X\nflags\t\t: {common} {' '.join(flags)}\n\n"


AVX512 = ("avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni")
# What each CPU kind's /proc/cpuinfo lists (the instruction sets that matter here).
EPYC_ZEN4 = x86(*AVX512, "avx512_bf16")  # this machine: AVX512-BF16, no AMX, no native float16
EPYC_ZEN2 = x86()  # AVX2 only
XEON_ICELAKE = x86(*AVX512)  # AVX-512 without bfloat16
XEON_SAPPHIRE_RAPIDS = x86(
    *AVX512, "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8"
)
FLOAT16_ONLY = x86(*AVX512, "avx512_fp16")  # no such CPU yet: the float16 branch alone
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sha1 sha2 crc32 asimdhp sve bf16\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 asimdhp\n"
POWER9 = "processor\t: 0\ncpu\t\t: POWER9, altivec supported\nclock\t\t: 2300MHz\n"


@pytest.mark.parametrize(
    ("cpuinfo", "amx_dtype", "dtype"),
    [
        (EPYC_ZEN4, None, BFLOAT16),
        (EPYC_ZEN4, SMOLLM2_AMX_DTYPE, BFLOAT16),  # no AMX: its exception does not apply
        (EPYC_ZEN2, None, FLOAT32),
        (XEON_ICELAKE, None, FLOAT32),
        (XEON_SAPPHIRE_RAPIDS, None, BFLOAT16),  # bfloat16 over float16 where both are native
        (XEON_SAPPHIRE_RAPIDS, SMOLLM2_AMX_DTYPE, FLOAT32),
        (FLOAT16_ONLY, None, FLOAT16),
        (GRAVITON3, None, BFLOAT16),
        (GRAVITON2, None, FLOAT32),
        (POWER9, None, AUTO),  # no flags we know: vLLM's own rule (bfloat16 on POWER)
        ("", None, AUTO),
    ],
    ids=[
        "epyc-zen4",
        "epyc-zen4-smollm2",
        "epyc-zen2",
        "xeon-icelake",
        "xeon-spr",
        "xeon-spr-smollm2",
        "float16-only",
        "graviton3",
        "graviton2",
        "power9",
        "unknown",
    ],
)
def test_each_cpu_kind_gets_its_fastest_native_dtype(
    cpuinfo: str, amx_dtype: str | None, dtype: str
) -> None:
    choice = for_cpu(cpuinfo, amx_dtype)
    assert choice.dtype == dtype
    assert choice.reason and choice.reason in str(choice)


def test_the_reason_names_the_instructions() -> None:
    assert "avx512_bf16" in for_cpu(EPYC_ZEN4).reason
    assert "amx_bf16, avx512_bf16" in for_cpu(XEON_SAPPHIRE_RAPIDS).reason
    assert "emulate" in for_cpu(EPYC_ZEN2).reason


def test_an_explicit_dtype_always_wins() -> None:
    assert worker_dtype("float16").dtype == "float16"
    assert worker_dtype("float16", SMOLLM2_AMX_DTYPE).reason == "given with --dtype"


# --- the real engine: the pick answers correctly here, and the worker shows it ---------------

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Egypt": "Cairo", "Russia": "Moscow", "China": "Beijing",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "United Kingdom": "London",
}  # fmt: skip
# Below float32's own count by a margin for greedy flips: where a dtype's kernels lose too much
# the model names almost none (bfloat16 on an AMX Xeon answered France with "L'Étoile").
ENOUGH_CAPITALS = 9
# bfloat16 keeps 8 bits of mantissa: MiniLM's bfloat16 vectors had a cosine of 0.99993 or more
# with float32's here (float16's 0.999999), ten times inside this bound. A kernel that computes
# wrongly (overflow, a wrong accumulation type) turns the vector well away from it, and two
# unrelated sentences of SENTENCES are far below it.
SAME_DIRECTION = 0.999


@pytest.fixture(scope="module")
def picked(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[Deployment]:
    """Both bundled models on workers left to pick their dtype, beside float32's reference."""
    with deployment("sqlite", tmp_path_factory.mktemp("sqlite")) as running:
        running.start_worker("minilm", ["--model", "bundled:minilm"])
        running.start_worker("chat", smollm2_args(smollm2))
        yield running


@pytest.fixture(scope="module")
def float32_vectors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """Raw vLLM's float32 embeddings of SENTENCES, computed while the workers start."""
    target = tmp_path_factory.mktemp("reference") / "float32.json"
    command = [sys.executable, "-m", "tests.reference_embeddings", FLOAT32, str(target)]
    log = target.with_suffix(".log").open("wb")
    child = subprocess.Popen(
        command, env=child_env(ENGINE_ENV), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )

    def vectors() -> Any:
        failed = child.wait(timeout=900) != 0
        assert not failed, target.with_suffix(".log").read_text(errors="replace")[:6000]
        return json.loads(target.read_text())

    yield vectors
    child.kill()
    log.close()


def cosines(a: list[list[float]], b: list[list[float]]) -> list[float]:
    x, y = np.array(a), np.array(b)
    return list((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1))


@pytest.mark.engine
def test_embeddings_in_the_picked_dtype_point_as_float32s(
    picked: Deployment, float32_vectors: Callable[[], Any]
) -> None:
    picked.workers["minilm"].wait_ready(timeout=900)
    lines = [
        line(f"e{i}", EMBEDDINGS, {"model": MINILM, "input": s}) for i, s in enumerate(SENTENCES)
    ]
    with picked.client() as client:
        batch_id = start_batch(client, jsonl(lines), endpoint=EMBEDDINGS)
        by_id = results(client, wait_status(client, batch_id, "completed", timeout=300))
    ours = [
        by_id[f"e{i}"]["response"]["body"]["data"][0]["embedding"] for i in range(len(SENTENCES))
    ]
    reference = float32_vectors()
    assert min(cosines(ours, reference)) >= SAME_DIRECTION
    # Different sentences stay apart: the check above could not pass on a constant vector.
    assert max(cosines(ours[:-1], reference[1:])) < SAME_DIRECTION


@pytest.mark.engine
def test_the_chat_model_in_its_picked_dtype_names_the_capitals(picked: Deployment) -> None:
    picked.workers["chat"].wait_ready(timeout=900)
    lines = [
        chat_line(country, f"What is the capital of {country}?", max_tokens=24, temperature=0)
        for country in CAPITALS
    ]
    with picked.client() as client:
        batch_id = start_batch(client, jsonl(lines))
        by_id = results(client, wait_status(client, batch_id, "completed", timeout=300))
    answers = {
        c: by_id[c]["response"]["body"]["choices"][0]["message"]["content"] for c in CAPITALS
    }
    named = [c for c, city in CAPITALS.items() if city in answers[c]]
    assert "France" in named and len(named) >= ENOUGH_CAPITALS, answers


@pytest.mark.engine
def test_the_worker_shows_its_dtype_and_why(picked: Deployment) -> None:
    worker = picked.workers["minilm"]
    worker.wait_ready(timeout=900)
    here = worker_dtype(None)
    assert f"dtype {here}" in worker.log_path.read_text(errors="replace")
    with httpx.Client(base_url=picked.server.url, timeout=60) as http:
        page = http.get("/dashboard/workers/minilm").text
        feed = http.get("/dashboard/api/workers/minilm").json()
    effective = {pair["key"]: pair["value"] for pair in feed["effective"]}
    assert (effective["dtype"], effective["dtype_reason"]) == (here.dtype, here.reason)
    assert here.reason.replace("'", "&#39;") in page
