"""Raw vLLM `LLM.chat` on the bundled SmolLM2 in each dtype, beside the one the worker picks.

    .venv/bin/python bench/bench_dtype.py [--requests 128] [--max-tokens 64]
        [--dtypes bfloat16,float32] [--model-dir FOLDER]

The worker runs every model on CPU in the fastest dtype the CPU computes in natively
(`worker.dtype`), the bundled SmolLM2 in float32 where vLLM runs its AMX kernels
(`worker.models.SMOLLM2_AMX_DTYPE`: in bfloat16 it answered badly there).
This prints the CPU's flags, the worker's pick, each dtype's tokens/s and ratio to the fastest,
and how many of 24 capitals each dtype names, each in a cold child process, so that the pick
can be checked on any machine.
"""

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_worker import Result, chats, run_raw  # noqa: E402


def cpu_flags() -> str:
    import torch

    avx512_bf16 = torch.cpu._is_avx512_bf16_supported()
    amx = torch.cpu._is_amx_tile_supported()
    return f"AVX-512: {torch.cpu._is_avx512_supported()}, AVX512-BF16: {avx512_bf16}, AMX: {amx}"


# A quiz the dequantized 4-bit model mostly knows: where a dtype's kernels lose too much, the
# answers go first (on an AMX Xeon in bfloat16, France's capital became "L'Étoile").
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Egypt": "Cairo", "Canada": "Ottawa", "Russia": "Moscow",
    "China": "Beijing", "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna",
    "Norway": "Oslo", "Sweden": "Stockholm", "Poland": "Warsaw", "Ireland": "Dublin",
    "Kenya": "Nairobi", "Peru": "Lima", "Argentina": "Buenos Aires", "Thailand": "Bangkok",
    "United Kingdom": "London", "India": "New Delhi", "Mexico": "Mexico City", "Cuba": "Havana",
}  # fmt: skip


def quiz(model_dir: Path, work: Path, dtype: str) -> int:
    """How many capitals the model names in `dtype`, greedy."""
    questions = [[{"role": "user", "content": f"What is the capital of {c}?"}] for c in CAPITALS]
    answers = run_raw(model_dir, questions, 24, work, dtype).texts
    return sum(city in answer for city, answer in zip(CAPITALS.values(), answers, strict=True))


def report(results: list[Result], picked: str, scores: dict[str, int]) -> None:
    fastest = max(r.tokens / r.phase for r in results)
    print(f"{'dtype':<10} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs fastest':>11} capitals")
    for r in results:
        speed = r.tokens / r.phase
        print(
            f"{r.dtype:<10} {r.tokens:>7} {r.phase:>8.1f} {speed:>7.0f} {speed / fastest:>10.2f}x"
            f" {scores[r.dtype]:>5}/{len(CAPITALS)}"
        )
    first, *others = results
    for other in others:
        same = sum(a == b for a, b in zip(first.texts, other.texts, strict=True))
        print(
            f"greedy texts equal between {first.dtype} and {other.dtype}: {same}/{len(first.texts)}"
        )
    best = max(results, key=lambda r: r.tokens / r.phase)
    effective = "bfloat16" if picked == "auto" else picked  # the converted folder's own dtype
    verdict = "the fastest here" if best.dtype == effective else f"slower here than {best.dtype}"
    print(f"the worker picks: {picked} = {effective} ({verdict})")


def main() -> None:
    from worker.dtype import worker_dtype
    from worker.models import SMOLLM2_AMX_DTYPE, ensure_converted

    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--model-dir", help="a converted SmolLM2 folder (default: convert one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="overnight-bench-dtype-"))
    model_dir = Path(args.model_dir) if args.model_dir else ensure_converted(work)
    messages = chats(args.requests, repetitive=False)
    print(cpu_flags(), flush=True)
    results, scores = [], {}
    for dtype in args.dtypes.split(","):
        results.append(run_raw(model_dir, messages, args.max_tokens, work, dtype))
        scores[results[-1].dtype] = quiz(model_dir, work, dtype)
        print(f"  {dtype}: {results[-1].tokens} tokens in {results[-1].phase:.1f} s", flush=True)
    picked = worker_dtype(None, SMOLLM2_AMX_DTYPE)
    print(f"the worker's rule: {picked}")
    report(results, picked.dtype, scores)


if __name__ == "__main__":
    main()
