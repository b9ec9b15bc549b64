"""The engine's LoRA side: vLLM's loaded adapters and its LoRA settings, for `worker.adapters`.

Part of the engine adapter (vLLM 0.32 internals: the serving models' `lora_requests` and
`load_lora_adapter`, the LoRA config and the platform), kept apart from `worker.engine`.
"""

from argparse import Namespace
from pathlib import Path
from typing import Any

from app.schemas.models import AnnouncedAdapter
from worker.adapter_repo import RepoSource
from worker.adapters import AdapterRule, AdapterSource, FolderSource, LoraAdapters


def announced_adapters(
    state: Any, base: str, served: LoraAdapters | None
) -> list[AnnouncedAdapter]:
    """The LoRA adapters vLLM has loaded (`--lora-modules`, and those of `--lora-dir` and
    `--lora-repo` a line named), as its `/v1/models` lists them, then the rest of theirs
    (loaded on first use)."""
    models = getattr(state, "openai_serving_models", None)
    loaded = models.lora_requests.values() if models is not None else []
    adapters = {
        lora.lora_name: AnnouncedAdapter(
            name=lora.lora_name, parent=lora.base_model_name or base, root=lora.path
        )
        for lora in loaded
    }
    for found in served.adapters.values() if served is not None else []:
        adapters.setdefault(
            found.name, AnnouncedAdapter(name=found.name, parent=base, root=found.root)
        )
    return list(adapters.values())


def loaded_adapters(state: Any) -> frozenset[str]:
    """The adapters vLLM holds now: `--lora-modules`', and those of `--lora-dir` and
    `--lora-repo` a line named (a claim prefers shards naming only these, `worker.claim`)."""
    models = getattr(state, "openai_serving_models", None)
    return frozenset(models.lora_requests) if models is not None else frozenset()


def adapter_rule(client: Any, served_names: list[str]) -> AdapterRule | None:
    """Which requests may share the engine when LoRA is on (`worker.adapters`)."""
    lora = client.vllm_config.lora_config
    if lora is None:
        return None
    from vllm.platforms import current_platform

    on_cpu = bool(current_platform.is_cpu())
    return AdapterRule(frozenset(served_names), int(lora.max_loras), base_apart=on_cpu)


def lora_adapters(state: Any, args: Namespace, served_names: list[str]) -> LoraAdapters | None:
    """`--lora-dir`'s and `--lora-repo`'s adapters, loaded and unloaded through vLLM's own
    `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` paths."""
    models = getattr(state, "openai_serving_models", None)
    if models is None:
        return None
    sources = adapter_sources(args, [*served_names, str(args.model)])
    if not sources:
        return None
    from vllm.entrypoints.serve.lora.protocol import (
        LoadLoRAAdapterRequest,
        UnloadLoRAAdapterRequest,
    )

    async def load(name: str, path: Path) -> str | None:
        request = LoadLoRAAdapterRequest(lora_name=name, lora_path=str(path))
        result = await models.load_lora_adapter(request, base_model_name=served_names[0])
        if isinstance(result, str) or name in models.lora_requests:
            return None
        return str(result.error.message)

    async def unload(name: str) -> None:
        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))

    return LoraAdapters(sources, load, unload)


def adapter_sources(args: Namespace, base_names: list[str]) -> list[AdapterSource]:
    """`--lora-dir`'s folder, then each `--lora-repo` once."""
    root = getattr(args, "lora_dir", None)
    sources: list[AdapterSource] = [FolderSource(Path(root), base_names)] if root else []
    repos = getattr(args, "lora_repo", None) or []
    return [*sources, *(RepoSource(repo) for repo in dict.fromkeys(repos))]
