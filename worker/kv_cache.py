"""The KV cache a CPU engine reserves when the user gives no size."""

import os

# GiB of KV cache each CPU vLLM engine reserves (VLLM_CPU_KVCACHE_SPACE). vLLM's own default
# is 92% of the machine's memory, so a second engine (`serve`, `run-batch`) could never start.
CPU_KV_CACHE_GIB = "2"


def reserve_cpu_kv_cache(kv_cache_memory_bytes: int | None) -> None:
    """A fixed KV cache for a CPU engine started by this process, unless the user chose one:
    by VLLM_CPU_KVCACHE_SPACE, or by `--kv-cache-memory-bytes`, which vLLM's CPU platform lets
    the variable override (so it is not set beside the flag)."""
    if kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = CPU_KV_CACHE_GIB
