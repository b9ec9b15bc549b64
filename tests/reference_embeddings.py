"""Raw vLLM's embeddings of SENTENCES on the bundled MiniLM in one dtype, written as JSON.

Run as its own process (`python -m tests.reference_embeddings DTYPE TARGET`) with nothing
else imported: vLLM's spawned engine processes import this module again as their main.
"""

import json
import sys
from pathlib import Path

SENTENCES = [
    "The committee postponed its decision on the new bridge until the spring survey is done.",
    "A small bakery on the corner sells rye bread, almond croissants and strong black coffee.",
    "Heavy rain flooded the lower streets of the old town and closed the railway for two days.",
    "She practised the violin every evening, hoping to join the city orchestra next season.",
    "Quantum computers use qubits that can hold a superposition of zero and one at once.",
    "The hikers reached the summit at dawn and watched the fog lift from the valley below.",
    "Interest rates rose again, and analysts expect housing prices to cool over the year.",
    "Our cat sleeps all afternoon on the warm windowsill and wakes only when dinner is served.",
    "The museum opened a new wing devoted to early photography and nineteenth century maps.",
    "Please remember to water the tomatoes, lock the back door and feed the goldfish tonight.",
    "Volcanic ash grounded flights across northern Europe for almost a week in April.",
    "He fixed the bicycle chain with a borrowed tool and rode twenty kilometres to the coast.",
]


def reference_embeddings(dtype: str, target: str) -> None:
    from vllm import LLM

    from worker.models import minilm_dir

    llm = LLM(model=str(minilm_dir()), runner="pooling", dtype=dtype, enforce_eager=True)
    outputs = llm.embed(SENTENCES, use_tqdm=False)
    Path(target).write_text(json.dumps([o.outputs.embedding for o in outputs]))


if __name__ == "__main__":
    reference_embeddings(*sys.argv[1:3])
