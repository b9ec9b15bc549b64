"""The output's lines: vLLM's error-line shape, and the input's order across both files."""

from collections.abc import Iterable, Iterator
from typing import Any

import orjson


def vllm_error_line(line: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI error line as vLLM's `run_batch` writes it: the status in `response` with a
    null body, the error in `error` (what vLLM's `BatchRequestOutput` validates)."""
    response = line.get("response")
    if response is None:
        return line  # never ran (cancelled, expired): the error is in `error` already
    return {**line, "response": {**response, "body": None}, "error": response.get("body")}


def in_input_order(
    custom_ids: Iterable[str], outputs: Iterator[bytes], errors: Iterator[bytes]
) -> Iterator[bytes]:
    """Merges the output and error lines (each in input order) into the input's order.

    Lines sharing a custom_id (vLLM allows them) may swap among themselves, nothing more.
    """
    sources = [outputs, errors]
    heads = [_head(outputs), _head(errors)]
    for custom_id in custom_ids:
        for i, head in enumerate(heads):
            if head is not None and head[0] == custom_id:
                yield head[1]
                heads[i] = _head(sources[i])
                break
    for i, head in enumerate(heads):
        while head is not None:
            yield head[1]
            head = heads[i] = _head(sources[i])


def _head(lines: Iterator[bytes]) -> tuple[str, bytes] | None:
    raw = next(lines, None)
    return None if raw is None else (str(orjson.loads(raw)["custom_id"]), raw)
