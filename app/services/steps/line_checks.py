"""Checking one request line of a batch's input file: each problem a `BatchError` naming its
1-based line and parameter. Validation (`steps.validation`) runs every line through one
`LineChecker`, which remembers the file's custom_ids and model as it goes.
"""

import hashlib
from typing import Any

import orjson

from app.config import Settings
from app.endpoints import canonical
from app.schemas.batches import BatchError
from app.services import enqueued, served_models
from app.services.media_urls import REFUSED_CODE, MediaRule, media_urls


def batch_error(
    code: str, message: str, line: int | None = None, param: str | None = None
) -> BatchError:
    return BatchError(code=code, message=message, param=param, line=line)


def _show(value: object, limit: int = 64) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return repr(text if len(text) <= limit else text[:limit] + "…")


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _JSON_TYPES.get(type(value), "a value")


class LineChecker:
    """Checks one request line against the batch; remembers custom_ids and the file's model.

    `per_line` is vLLM's `run_batch` contract: only a line that is not a request fails the
    file; a duplicate custom_id, another url or model is run, and answered, line by line.
    """

    def __init__(self, settings: Settings, endpoint: str, per_line: bool = False) -> None:
        self.settings = settings
        self.endpoint = endpoint
        self.per_line = per_line
        self.model: str | None = settings.models[0].name if per_line else None
        # Estimated prompt tokens of the requests checked so far (the enqueued-token limit).
        self.prompt_tokens = 0
        # The model the line last checked names (None if it names none): its shard's adapters.
        self.line_model: str | None = None
        # custom_id digests, not the strings: memory stays small however long the ids are.
        self._seen: dict[bytes, int] = {}
        self._model_errors: dict[str, tuple[str, str] | None] = {}
        self._served: list[served_models.Servable] | None = None
        self._media = MediaRule.of(settings, remember=True)

    def check(self, line_no: int, raw: bytes) -> BatchError | None:
        self.line_model = None
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._unparseable(line_no, raw)
        if not isinstance(request, dict):
            return batch_error(
                "invalid_json_line",
                f"This line is not a JSON object (it is {_type_name(request)}).",
                line_no,
            )
        return self._check_request(line_no, request)

    @staticmethod
    def _unparseable(line_no: int, raw: bytes) -> BatchError:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return batch_error(
                "invalid_utf8",
                f"This line is not valid UTF-8 (invalid byte at column {exc.start + 1}).",
                line_no,
            )
        return batch_error(
            "invalid_json_line", "This line is not parseable as valid JSON.", line_no
        )

    def _check_request(self, line_no: int, request: dict[str, Any]) -> BatchError | None:
        custom_id = request.get("custom_id")
        if (problem := _require(line_no, "custom_id", custom_id, str)) is not None:
            return problem
        assert isinstance(custom_id, str)
        if self.per_line:
            return _check_shape(line_no, request)
        if (problem := self._check_unique(line_no, custom_id)) is not None:
            return problem
        method = request.get("method")
        if method is None:
            return _missing(line_no, "method")
        if method != "POST":
            return batch_error(
                "invalid_method",
                f"Invalid value for 'method': {_show(method)}. Only 'POST' is supported.",
                line_no,
                "method",
            )
        url = request.get("url")
        if url is None:
            return _missing(line_no, "url")
        if not isinstance(url, str) or canonical(url) != canonical(self.endpoint):
            return batch_error(
                "url_mismatch",
                f"The url {_show(url)} does not match the batch's endpoint {self.endpoint!r}; "
                "every line's url must equal the endpoint the batch was created with.",
                line_no,
                "url",
            )
        body = request.get("body")
        if (problem := _require(line_no, "body", body, dict)) is not None:
            return problem
        assert isinstance(body, dict)
        self.prompt_tokens += enqueued.estimate_prompt_tokens(body)
        model = body.get("model")
        if (problem := _require(line_no, "body.model", model, str)) is not None:
            return problem
        assert isinstance(model, str)
        self.line_model = model
        if (problem := self._check_model(line_no, model)) is not None:
            return problem
        return self._check_media(line_no, body)

    def _check_unique(self, line_no: int, custom_id: str) -> BatchError | None:
        digest = hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16)
        first = self._seen.setdefault(digest.digest(), line_no)
        if first == line_no:
            return None
        return batch_error(
            "duplicate_custom_id",
            f"The custom_id {_show(custom_id)} is already used on line {first}; "
            "custom_id values must be unique within a batch.",
            line_no,
            "custom_id",
        )

    def _check_model(self, line_no: int, model: str) -> BatchError | None:
        # OpenAI's one-model rule holds for the base model: its LoRA adapters may share a batch.
        found = served_models.named(self._served_models(), model)
        base = found.base if found is not None else model
        if self.model is None:
            self.model = base
        elif base != self.model:
            return batch_error(
                "mismatched_model",
                f"The model {_show(model)} differs from the model {_show(self.model)} of the "
                "first request; a batch file may use only one model (and its LoRA adapters).",
                line_no,
                "body.model",
            )
        if model not in self._model_errors:
            self._model_errors[model] = self._model_problem(model)
        problem = self._model_errors[model]
        return None if problem is None else batch_error(*problem, line_no, "body.model")

    def _check_media(self, line_no: int, body: dict[str, Any]) -> BatchError | None:
        """A media URL a worker may not fetch fails the file here, before any fetch."""
        refused = self._media.first_refusal(media_urls(body))
        if refused is None:
            return None
        return batch_error(REFUSED_CODE, refused.message, line_no, f"body.{refused.param}")

    def _model_problem(self, model: str) -> tuple[str, str] | None:
        endpoint = canonical(self.endpoint)
        models = self._served_models()
        return served_models.problem(models, self.settings, model, endpoint, _show(model))

    def _served_models(self) -> list[served_models.Servable]:
        """Read once per file, on its first model check."""
        if self._served is None:
            self._served = served_models.read(self.settings)
        return self._served


def _check_shape(line_no: int, request: dict[str, Any]) -> BatchError | None:
    """What vLLM's `BatchRequestInput` requires of a line: strings and an object body."""
    for param, kind in (("method", str), ("url", str), ("body", dict)):
        if (problem := _require(line_no, param, request.get(param), kind)) is not None:
            return problem
    return None


def _missing(line_no: int, param: str) -> BatchError:
    return batch_error(
        "missing_required_parameter", f"Missing required parameter: '{param}'.", line_no, param
    )


def _require(line_no: int, param: str, value: object, kind: type) -> BatchError | None:
    if value is None:
        return _missing(line_no, param)
    if isinstance(value, kind):
        return None
    expected = _JSON_TYPES[kind]
    return batch_error(
        "invalid_type",
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)}.",
        line_no,
        param,
    )
