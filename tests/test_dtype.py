"""The worker's dtype rule (worker/dtype.py): each CPU kind's pick, from its /proc/cpuinfo text.

That the pick answers correctly on the real engine here (embeddings as float32's, capitals
named) and that the worker shows it is checked on `tests/test_worker_engine.py`'s workers,
which leave their dtype to the rule (no engine of its own here).
"""

from pathlib import Path

import pytest

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
