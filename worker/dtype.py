"""The dtype a worker runs its model in when `--dtype` is not given: one rule for every model.

On CPU, vLLM's `auto` takes the model's own dtype (and float16 for pooling models), which a
CPU without the matching instructions only emulates. On an AMD EPYC with AVX512-BF16 and no
native float16, all-MiniLM-L6-v2 embedded 28-31 inputs/s in float16, 143 in float32 and
235-295 in bfloat16 (`bench/bench_per_request.py` prints the dtype of every runner). So on
CPU the worker takes the fastest dtype the CPU runs natively; elsewhere (CUDA, ROCm, ...)
vLLM's own choice stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"
FLOAT32 = "float32"

# /proc/cpuinfo's names (x86 `flags`, aarch64 `Features`) of the instructions that compute in
# each 16-bit type; bfloat16 first where a CPU has both (its range is float32's).
NATIVE_BFLOAT16 = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
NATIVE_FLOAT16 = frozenset({"amx_fp16", "avx512_fp16"})
# vLLM runs its AMX attention and small-GEMM kernels where the CPU has AMX tiles.
AMX_TILES = "amx_tile"
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype vLLM gets, and why, for the worker's log and the dashboard."""

    dtype: str
    reason: str

    def __str__(self) -> str:
        return f"{self.dtype} ({self.reason})"


def cpu_flags(cpuinfo: str) -> frozenset[str] | None:
    """The instruction-set flags in /proc/cpuinfo's text; None where it lists none we know."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def for_cpu(cpuinfo: str, amx_dtype: str | None = None) -> DtypeChoice:
    """The fastest dtype this CPU runs natively; `amx_dtype` where vLLM's AMX kernels answer
    the model wrongly in it (`worker.models.SMOLLM2_AMX_DTYPE`)."""
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return DtypeChoice(AUTO, "vLLM's default: the CPU's instruction sets are unknown")
    if amx_dtype is not None and AMX_TILES in flags:
        return DtypeChoice(amx_dtype, "this model answers wrongly in vLLM's AMX kernels")
    if bf16 := sorted(flags & NATIVE_BFLOAT16):
        return DtypeChoice(BFLOAT16, f"the CPU computes in bfloat16: {', '.join(bf16)}")
    if fp16 := sorted(flags & NATIVE_FLOAT16):
        return DtypeChoice(FLOAT16, f"the CPU computes in float16: {', '.join(fp16)}")
    return DtypeChoice(FLOAT32, "the CPU has no bfloat16 or float16 instructions: it would emulate")


def worker_dtype(given: str | None, amx_dtype: str | None = None) -> DtypeChoice:
    """The dtype a worker on this machine runs a model in: `--dtype` if `given`, else the
    rule's pick for this machine (and the model's `amx_dtype`, if it has one)."""
    if given is not None:
        return DtypeChoice(given, "given with --dtype")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return DtypeChoice(AUTO, f"vLLM's default on {current_platform.device_type}")
    cpuinfo = CPUINFO.read_text(errors="replace") if CPUINFO.exists() else ""
    return for_cpu(cpuinfo, amx_dtype)
