"""Streaming `multipart/form-data`: one named part flows straight into a sink.

Starlette's `request.form()` spools every file part to a temporary copy first. Here
python-multipart's low-level parser is fed from `request.stream()`; the bytes of the
streamed part are handed to the sink in ~1 MiB batches on a worker thread while the
next batch is received, so memory stays flat whatever the size. Other parts are small
text fields. Whatever goes wrong (bad body, limit passed, client gone), the sink is
aborted and nothing is left behind.
"""

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from app.api.body import check_declared_length, client_disconnected, too_large
from app.core.sizes import SizeLimit, human_bytes
from app.errors import OpenAIError

FLUSH_BYTES = 1 << 20
MAX_FIELD_BYTES = 64 * 1024
MAX_PARTS = 64
# Room for boundaries, part headers and text fields around the streamed part.
FORM_OVERHEAD_BYTES = 1 << 20


class PartSink(Protocol):
    """Where the streamed part's bytes go; `write` runs on a worker thread."""

    def write(self, data: bytes) -> None: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class PartInfo:
    name: str
    # Exactly what the client sent (UTF-8, else Latin-1): user data, never a path.
    filename: str | None
    content_type: str | None


OpenSink = Callable[[PartInfo, Mapping[str, str]], PartSink]


@dataclass(frozen=True)
class Form:
    fields: dict[str, str]
    streamed: PartInfo | None
    sink: PartSink | None


def malformed(detail: str) -> OpenAIError:
    return OpenAIError(f"Malformed multipart/form-data body: {detail}")


def missing_part(name: str) -> OpenAIError:
    return OpenAIError(
        f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
    )


def _decode_name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class _Collector:
    """python-multipart callbacks: part headers, small text fields, streamed bytes."""

    def __init__(self, stream_field: str, open_sink: OpenSink) -> None:
        self.stream_field = stream_field
        self.open_sink = open_sink
        self.fields: dict[str, str] = {}
        self.streamed: PartInfo | None = None
        self.sink: PartSink | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.finished = False
        self._parts = 0
        self._mode: str | None = None  # "stream", "field" or "skip"
        self._headers: dict[bytes, bytes] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._field_name = ""
        self._field_value = bytearray()

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def flush(self) -> Callable[[], None]:
        """A call that hands the pending bytes to the sink (to run on a worker thread)."""
        sink, pieces = self.sink, self.pending
        assert sink is not None
        self.pending = []
        self.pending_bytes = 0

        def write() -> None:
            for piece in pieces:
                sink.write(piece)

        return write

    def on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise malformed(f"more than {MAX_PARTS} parts.")
        self._headers = {}

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def on_headers_finished(self) -> None:
        disposition = self._headers.get(b"content-disposition")
        if disposition is None:
            raise malformed("a part has no Content-Disposition header.")
        _, options = parse_options_header(disposition)
        if b"name" not in options:
            raise malformed("a part has no name.")
        name = _decode_name(options[b"name"])
        raw_filename = options.get(b"filename")
        filename = None if raw_filename is None else _decode_name(raw_filename)
        if name == self.stream_field:
            if self.streamed is not None:
                raise OpenAIError(f"Only one '{name}' part is allowed.", param=name)
            content_type = self._headers.get(b"content-type")
            self.streamed = PartInfo(
                name, filename, None if content_type is None else content_type.decode("latin-1")
            )
            self.sink = self.open_sink(self.streamed, self.fields)
            self._mode = "stream"
        elif raw_filename is not None:
            self._mode = "skip"  # an unexpected file: tolerated, not kept
        else:
            self._mode = "field"
            self._field_name = name
            self._field_value = bytearray()

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._mode == "stream":
            # Most chunks are all part data: keep them without copying.
            self.pending.append(data if start == 0 and end == len(data) else data[start:end])
            self.pending_bytes += end - start
        elif self._mode == "field":
            if len(self._field_value) + end - start > MAX_FIELD_BYTES:
                raise OpenAIError(
                    f"The form field '{self._field_name}' is longer than "
                    f"{human_bytes(MAX_FIELD_BYTES)}.",
                    param=self._field_name,
                )
            self._field_value += data[start:end]

    def on_part_end(self) -> None:
        if self._mode == "field":
            self.fields[self._field_name] = self._field_value.decode("utf-8", errors="replace")
        self._mode = None

    def on_end(self) -> None:
        self.finished = True


def _boundary(content_type: str | None) -> bytes:
    media_type, options = parse_options_header(content_type)
    if media_type != b"multipart/form-data":
        raise OpenAIError(
            "This endpoint expects a multipart/form-data body "
            "(e.g. curl -F purpose=batch -F file=@requests.jsonl)."
        )
    boundary = options.get(b"boundary")
    if not boundary:
        raise malformed("the Content-Type header has no boundary.")
    return boundary


async def read_multipart(
    request: Request, *, stream_field: str, open_sink: OpenSink, limit: SizeLimit
) -> Form:
    """Parse the body as it arrives, streaming the part named `stream_field` into a sink.

    `open_sink(part, fields_so_far)` is called when that part's headers are complete
    and may refuse it by raising. The returned form holds the text fields and the
    sink, which the caller then commits or aborts.
    """
    boundary = _boundary(request.headers.get("content-type"))
    # The streamed part has its own limit (the sink's); this one bounds the whole form.
    check_declared_length(request, limit, FORM_OVERHEAD_BYTES)
    max_body = limit.bytes + FORM_OVERHEAD_BYTES
    collector = _Collector(stream_field, open_sink)
    try:
        parser = MultipartParser(boundary, collector.callbacks())
    except FormParserError as exc:
        raise malformed(str(exc)) from None
    received = 0
    writing: asyncio.Task[None] | None = None
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_body:
                raise too_large(limit)
            try:
                parser.write(chunk)
            except MultipartParseError as exc:
                raise malformed(str(exc)) from None
            if collector.sink is not None and collector.pending_bytes >= FLUSH_BYTES:
                if writing is not None:
                    await writing
                writing = asyncio.create_task(run_in_threadpool(collector.flush()))
        if not collector.finished:
            raise malformed("the body ended before the closing boundary (truncated upload?).")
        if writing is not None:
            await writing
            writing = None
        if collector.sink is not None and collector.pending_bytes:
            await run_in_threadpool(collector.flush())
    except BaseException as exc:
        if writing is not None:
            await asyncio.gather(writing, return_exceptions=True)
        if collector.sink is not None:
            collector.sink.abort()
        if isinstance(exc, ClientDisconnect):
            raise client_disconnected() from None
        raise
    return Form(collector.fields, collector.streamed, collector.sink)


def multipart_openapi(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """`openapi_extra` that documents a body read with `read_multipart`."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {
        "requestBody": {
            "required": True,
            "content": {"multipart/form-data": {"schema": schema}},
        }
    }


_BRACKETED = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])+)$")


def nest_brackets(fields: Mapping[str, str]) -> dict[str, Any]:
    """`{"expires_after[seconds]": "3600"}` → `{"expires_after": {"seconds": "3600"}}`."""
    nested: dict[str, Any] = {}
    for name, value in fields.items():
        match = _BRACKETED.match(name)
        keys = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))] if match else [name]
        target = nested
        for key in keys[:-1]:
            child = target.setdefault(key, {})
            if not isinstance(child, dict):
                raise OpenAIError(f"The form field '{name}' conflicts with '{key}'.", param=name)
            target = child
        if isinstance(target.get(keys[-1]), dict):
            raise OpenAIError(f"The form field '{name}' conflicts with another field.", param=name)
        target[keys[-1]] = value
    return nested
