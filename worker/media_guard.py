"""The engine as the worker's scheduler sees it: a request whose media URL the deployment does
not allow is answered 400 and never reaches vLLM, which would fetch it.

Validation refuses such batch lines already; this catches what changed since: a host that
resolves to a private address now, a narrower allowance, a batch validated before either,
and every line of `run-batch` (which validates per line). vLLM itself follows redirects of
media URLs unless told not to, which would take a fetch from an allowed host anywhere.
"""

import asyncio
import os
from collections.abc import Iterable
from typing import Any

from app.services.media_urls import REFUSED_CODE, MediaRule, media_urls
from worker.engine import Engine
from worker.engine_gauges import EngineStats
from worker.engine_results import EngineResult, error_result


def forbid_media_redirects() -> None:
    """vLLM fetches media without following redirects, unless the operator set otherwise."""
    os.environ.setdefault("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0")


class MediaGuard:
    """`engine` behind the deployment's media rule (`Engine`'s interface)."""

    def __init__(self, engine: Engine, rule: MediaRule) -> None:
        self.engine = engine
        self.rule = rule
        self.served_names = engine.served_names
        self.max_num_seqs = engine.max_num_seqs
        self.configuration = engine.configuration

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        urls = media_urls(body)
        if urls:
            # Resolving a host blocks.
            refused = await asyncio.to_thread(self.rule.first_refusal, urls)
            if refused is not None:
                return error_result(400, refused.message, refused.param, REFUSED_CODE)
        return await self.engine.run(endpoint, body, request_id)

    async def abort(self, request_ids: Iterable[str]) -> None:
        await self.engine.abort(request_ids)
