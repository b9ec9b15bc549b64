"""`--lora-repo ORG/NAME`: the LoRA adapters of a Hugging Face repo, downloaded on first use.

As vLLM's own hub resolver (`vllm/plugins/lora_resolvers/hf_hub_resolver.py`) names them:
the repo itself, if it holds `adapter_config.json` at its root, is served as `ORG/NAME`,
and each folder holding one as `ORG/NAME/SUB`. The repo is listed at worker start and every
five minutes after (from the Hugging Face cache under HF_HUB_OFFLINE); an adapter's files
are downloaded into the cache when a line first names it, then loaded as `--lora-dir`'s are
(`worker.adapters`).
HF_ENDPOINT, HF_TOKEN, HF_HOME and HF_HUB_OFFLINE apply as to the worker's model.
"""

import logging
import posixpath
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from worker.adapters import ADAPTER_CONFIG

log = logging.getLogger("overnight.worker")

# How often a `--lora-repo` is listed again, for adapters added to or removed from the repo.
REPO_RELIST_SECONDS = 300.0


@dataclass(frozen=True)
class RepoAdapter:
    """One adapter of a hub repo: `folder` is its place in the repo ("" at its root)."""

    repo: str
    folder: str
    files: tuple[str, ...]  # its files in the repo, downloaded on first use

    @property
    def name(self) -> str:
        return posixpath.join(self.repo, self.folder) if self.folder else self.repo

    @property
    def root(self) -> str:
        from huggingface_hub import constants

        where = f"/tree/main/{self.folder}" if self.folder else ""
        return f"{constants.ENDPOINT}/{self.repo}{where}"

    def local(self) -> Path:
        """Its folder in the Hugging Face cache, downloaded if need be (OSError if it cannot)."""
        from huggingface_hub import snapshot_download

        try:
            snapshot = snapshot_download(self.repo, allow_patterns=list(self.files))
        except Exception as exc:  # huggingface_hub's HTTP, cache and offline errors alike
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        return Path(snapshot) / self.folder


def adapters_in(repo: str, files: Iterable[str]) -> list[RepoAdapter]:
    """The adapters of `repo` whose files are `files`: each folder holding an adapter config."""
    paths = sorted(files)
    folders = sorted(
        {posixpath.dirname(p) for p in paths if posixpath.basename(p) == ADAPTER_CONFIG}
    )
    return [RepoAdapter(repo, folder, _files_of(folder, paths)) for folder in folders]


def _files_of(folder: str, paths: list[str]) -> tuple[str, ...]:
    # The root adapter takes the root's files only, not the other adapters' folders.
    if not folder:
        return tuple(p for p in paths if "/" not in p)
    return tuple(p for p in paths if p.startswith(f"{folder}/"))


def repo_files(repo: str) -> list[str]:
    """The files of `repo` on the hub, or those of its cached snapshot under HF_HUB_OFFLINE."""
    from huggingface_hub import HfApi, constants

    if not constants.HF_HUB_OFFLINE:
        return HfApi().list_repo_files(repo)
    snapshot = _cached_snapshot(repo)
    return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def _cached_snapshot(repo: str) -> Path:
    """The cached snapshot of `repo`'s main revision: the files downloaded so far (a partial
    snapshot, which `snapshot_download(local_files_only=True)` refuses)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cached = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    try:
        commit = (cached / "refs" / "main").read_text().strip()
    except OSError:
        raise FileNotFoundError(f"not in the Hugging Face cache ({cached})") from None
    return cached / "snapshots" / commit


class RepoSource:
    """`--lora-repo`'s adapters: listed at start, then again every `relist_seconds` (a
    heartbeat would ask the hub too often). A repo that cannot be listed at start serves none
    (a warning says why) while the worker serves everything else; one that cannot be listed
    again keeps the adapters it had."""

    def __init__(self, repo: str, relist_seconds: float = REPO_RELIST_SECONDS) -> None:
        self.repo, self.relist_seconds = repo, relist_seconds
        self.found = self._list() or []
        self._listed_at = time.monotonic()

    def _list(self) -> list[RepoAdapter] | None:
        try:
            found = adapters_in(self.repo, repo_files(self.repo))
        except Exception as exc:  # huggingface_hub's HTTP, cache and offline errors alike
            log.warning("--lora-repo %s cannot be listed: %s", self.repo, exc)
            return None
        if not found:
            log.warning("--lora-repo %s holds no %s", self.repo, ADAPTER_CONFIG)
        return found

    def scan(self) -> None:
        """List the repo again once `relist_seconds` have passed since the last listing."""
        if time.monotonic() - self._listed_at < self.relist_seconds:
            return
        self._listed_at = time.monotonic()
        found = self._list()
        if found is not None:
            self.found = found
