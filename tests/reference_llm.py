"""vLLM's own offline answers for a list of chats: `python tests/reference_llm.py MODEL IN OUT`.

IN is a JSON list of `{"messages": [...], "max_tokens": int, "stop": [...]}`; OUT gets the
greedy texts in the same order. The worker tests compare their batch outputs with these.
"""

import json
import sys


def main(model: str, source: str, target: str) -> None:
    from vllm import LLM, SamplingParams

    from worker.cli import smollm2_dtype

    with open(source) as f:
        chats = json.load(f)
    # The dtype the worker picks for the bundled SmolLM2 on this machine: greedy texts are
    # equal only within one dtype.
    dtype = smollm2_dtype()
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=2048)
    params = [
        SamplingParams(temperature=0, max_tokens=c["max_tokens"], stop=c.get("stop")) for c in chats
    ]
    outputs = llm.chat([c["messages"] for c in chats], params, use_tqdm=False)
    with open(target, "w") as f:
        json.dump([o.outputs[0].text for o in outputs], f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
