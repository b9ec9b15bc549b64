"""Asynchronous validation of a batch's input file: `validating` → `in_progress` or `failed`.

The file is streamed once. Every problem is recorded with its 1-based line (up
to `settings.max_reported_errors`); a clean file is cut into shards with their
byte ranges. Validation runs under the batch lease and ends in one fenced
transaction, so a validator killed at any point is simply replaced by the next
one after `lease_seconds`, and the shards are written exactly once.
"""

import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.sizes import too_large_message
from app.core.states import BatchStatus, BatchStep
from app.db.clock import db_now
from app.db.models import Batch, File, Shard
from app.db.session import session_scope
from app.endpoints import canonical
from app.schemas.batches import BatchError
from app.services import batch_lease, enqueued, schedule, served_models, step_share
from app.services.batch_end import end_batch
from app.services.batch_lease import Heartbeat
from app.services.jsonl import scan_lines
from app.services.media_urls import REFUSED_CODE, MediaRule, media_urls
from app.storage import Storage, storage_of

log = logging.getLogger("overnight.validation")

# A file whose validation keeps killing its validator fails instead of looping forever.
MAX_VALIDATION_ATTEMPTS = 5
_HEARTBEAT_CHECK_LINES = 256


def _error(
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


@dataclass
class ShardPlan:
    index: int
    first_line: int
    byte_start: int
    line_count: int = 0
    prompt_tokens: int = 0


@dataclass
class Outcome:
    """What reading the file found: problems, or shards ready to run."""

    errors: list[BatchError] = field(default_factory=list)
    shards: list[ShardPlan] = field(default_factory=list)
    total: int = 0
    model: str | None = None
    size: int = 0


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
        # custom_id digests, not the strings: memory stays small however long the ids are.
        self._seen: dict[bytes, int] = {}
        self._model_errors: dict[str, tuple[str, str] | None] = {}
        self._served: list[served_models.Servable] | None = None
        self._media = MediaRule.of(settings, remember=True)

    def check(self, line_no: int, raw: bytes) -> BatchError | None:
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._unparseable(line_no, raw)
        if not isinstance(request, dict):
            return _error(
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
            return _error(
                "invalid_utf8",
                f"This line is not valid UTF-8 (invalid byte at column {exc.start + 1}).",
                line_no,
            )
        return _error("invalid_json_line", "This line is not parseable as valid JSON.", line_no)

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
            return _error(
                "invalid_method",
                f"Invalid value for 'method': {_show(method)}. Only 'POST' is supported.",
                line_no,
                "method",
            )
        url = request.get("url")
        if url is None:
            return _missing(line_no, "url")
        if not isinstance(url, str) or canonical(url) != canonical(self.endpoint):
            return _error(
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
        if (problem := self._check_model(line_no, model)) is not None:
            return problem
        return self._check_media(line_no, body)

    def _check_unique(self, line_no: int, custom_id: str) -> BatchError | None:
        digest = hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16)
        first = self._seen.setdefault(digest.digest(), line_no)
        if first == line_no:
            return None
        return _error(
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
            return _error(
                "mismatched_model",
                f"The model {_show(model)} differs from the model {_show(self.model)} of the "
                "first request; a batch file may use only one model (and its LoRA adapters).",
                line_no,
                "body.model",
            )
        if model not in self._model_errors:
            self._model_errors[model] = self._model_problem(model)
        problem = self._model_errors[model]
        return None if problem is None else _error(*problem, line_no, "body.model")

    def _check_media(self, line_no: int, body: dict[str, Any]) -> BatchError | None:
        """A media URL a worker may not fetch fails the file here, before any fetch."""
        refused = self._media.first_refusal(media_urls(body))
        if refused is None:
            return None
        return _error(REFUSED_CODE, refused.message, line_no, f"body.{refused.param}")

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
    return _error(
        "missing_required_parameter", f"Missing required parameter: '{param}'.", line_no, param
    )


def _require(line_no: int, param: str, value: object, kind: type) -> BatchError | None:
    if value is None:
        return _missing(line_no, param)
    if isinstance(value, kind):
        return None
    expected = _JSON_TYPES[kind]
    return _error(
        "invalid_type",
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)}.",
        line_no,
        param,
    )


def read_input(
    settings: Settings,
    storage: Storage,
    key: str,
    endpoint: str,
    heartbeat: Heartbeat | None = None,
    per_line: bool = False,
) -> Outcome | None:
    """Streams the file once; None if the heartbeat says to stop (lease lost, batch cancelled)."""
    outcome = Outcome(size=storage.size(key))
    checker = LineChecker(settings, endpoint, per_line)
    limit, shard_lines = settings.max_batch_requests, settings.shard_lines
    for line_no, offset, raw in _lines(storage, key):
        if outcome.total % _HEARTBEAT_CHECK_LINES == 0 and heartbeat and not heartbeat.beat():
            return None
        if outcome.total == limit:
            outcome.errors.append(_too_many(limit, line_no))
            break
        if outcome.total % shard_lines == 0:
            outcome.shards.append(ShardPlan(len(outcome.shards), line_no, offset))
        shard = outcome.shards[-1]
        shard.line_count += 1
        outcome.total += 1
        tokens_before = checker.prompt_tokens
        problem = checker.check(line_no, raw)
        shard.prompt_tokens += checker.prompt_tokens - tokens_before
        if problem is not None:
            outcome.errors.append(problem)
            if len(outcome.errors) >= settings.max_reported_errors:
                break
    outcome.model = checker.model
    if outcome.total == 0 and not outcome.errors:
        outcome.errors.append(_error("empty_file", "The batch input file contains no requests."))
    return outcome


def _lines(storage: Storage, key: str) -> Iterator[tuple[int, int, bytes]]:
    return scan_lines(storage.read(key))


def _too_many(limit: int, line_no: int) -> BatchError:
    return _error(
        "too_many_tasks",
        f"The batch input file has more than {limit:,} requests, the most one batch may hold.",
        line_no,
    )


@dataclass(frozen=True)
class InputFile:
    storage_key: str
    bytes: int
    endpoint: str


def claim_next(settings: Settings, owner: str) -> tuple[BatchLease, InputFile | None] | None:
    """Takes the lease of the next `validating` batch nobody is validating: the oldest of the
    project with the lowest validation clock (`step_share`), and moves that clock.

    Not one past its `expires_at`: the finalizer expires it as it is, with no request counted
    and no file (validating it now would only turn each line into a `batch_expired` one).
    """
    with session_scope(settings) as session:
        waiting = Batch.status == BatchStatus.VALIDATING
        candidates = select(Batch.id, Batch.lease_epoch).where(
            waiting, Batch.expires_at > db_now(), batch_lease.lease_is_free(settings)
        )
        rows = session.execute(
            step_share.in_order(candidates, BatchStep.VALIDATION, settings.scheduler)
            .limit(8)
            .with_for_update(skip_locked=True, of=Batch)
        ).all()
        for batch_id, epoch in rows:
            lease = batch_lease.take(session, batch_id, epoch, owner)
            if lease is not None:
                step = BatchStep.VALIDATION
                step_share.charge(session, step, batch_id, waiting, settings.scheduler)
                return lease, _input_file(session, batch_id)
    return None


def _input_file(session: Any, batch_id: str) -> InputFile | None:
    # A deleted input file keeps its bytes while a batch still reads it; only they matter.
    row = session.execute(
        select(File.storage_key, File.bytes, Batch.endpoint)
        .join(Batch, Batch.input_file_id == File.id)
        .where(Batch.id == batch_id)
    ).one()
    return InputFile(row.storage_key, row.bytes, row.endpoint) if row.storage_key else None


def validate(
    settings: Settings,
    storage: Storage,
    lease: BatchLease,
    source: InputFile | None,
    per_line: bool = False,
) -> BatchStatus | None:
    """Validates one claimed batch and records the result: its new status, None if abandoned."""
    if lease.epoch > MAX_VALIDATION_ATTEMPTS:
        message = (
            f"Validation of the input file was interrupted {MAX_VALIDATION_ATTEMPTS} times; "
            "the batch was given up."
        )
        return record(settings, lease, Outcome(errors=[_error("validation_interrupted", message)]))
    if source is None or not storage.exists(source.storage_key):
        message = "The input file was deleted before the batch could be validated."
        return record(
            settings,
            lease,
            Outcome(errors=[_error("file_not_found", message, None, "input_file_id")]),
        )
    if source.bytes > settings.max_batch_file_bytes:
        return record(settings, lease, Outcome(errors=[_too_large(settings, source.bytes)]))
    outcome = read_input(
        settings,
        storage,
        source.storage_key,
        source.endpoint,
        Heartbeat(settings, lease, BatchStatus.VALIDATING),
        per_line,
    )
    if outcome is None:
        batch_lease.release(settings, lease)
        return None
    return record(settings, lease, outcome)


def _too_large(settings: Settings, size: int) -> BatchError:
    limit = settings.size_limit("max_batch_file_bytes")
    return _error(
        "file_too_large",
        too_large_message("The batch input file", limit, size),
        None,
        "input_file_id",
    )


def record(settings: Settings, lease: BatchLease, outcome: Outcome) -> BatchStatus | None:
    """The one fenced transaction that ends validation: shards + `in_progress`, or `failed`."""
    with session_scope(settings) as session:
        batch = session.scalar(
            select(Batch)
            .where(
                Batch.id == lease.batch_id,
                Batch.lease_epoch == lease.epoch,
                Batch.status == BatchStatus.VALIDATING,
            )
            .with_for_update()
        )
        status = None
        if batch is not None:
            _apply(session, settings, batch, outcome)
            status = batch.status
        # Released even when fenced off: a cancel arriving mid-read is finished by the finalizer.
    if status is None:
        batch_lease.release(settings, lease)
    return status


def _apply(session: Session, settings: Settings, batch: Batch, outcome: Outcome) -> None:
    now = int(time.time())
    if not outcome.errors and outcome.model is not None:
        tokens = sum(plan.prompt_tokens for plan in outcome.shards)
        problem = enqueued.admit(session, settings, batch, outcome.model, outcome.total, tokens)
        if problem is not None:
            outcome.errors.append(problem)
    if outcome.errors:
        batch.errors = [e.model_dump() for e in outcome.errors]
        end_batch(session, batch, BatchStatus.FAILED, now)
        return
    batch.lease_owner = None
    batch.heartbeat_at = None
    batch.status = BatchStatus.IN_PROGRESS
    batch.in_progress_at = now
    batch.total = outcome.total
    batch.model = outcome.model
    schedule.admit(session, batch)
    ends = [s.byte_start for s in outcome.shards[1:]] + [outcome.size]
    session.add_all(
        Shard(
            batch_id=batch.id,
            index=plan.index,
            first_line=plan.first_line,
            line_count=plan.line_count,
            byte_start=plan.byte_start,
            byte_end=end,
            prompt_tokens=plan.prompt_tokens,
        )
        for plan, end in zip(outcome.shards, ends, strict=True)
    )


def validate_pending(
    settings: Settings, owner: str, storage: Storage | None = None, per_line: bool = False
) -> int:
    """Validates every claimable `validating` batch; returns how many were finished.

    `per_line`: `LineChecker`'s vLLM contract (`overnight run-batch`).
    """
    storage = storage or storage_of(settings)
    done = 0
    while (claimed := claim_next(settings, owner)) is not None:
        lease, source = claimed
        try:
            status = validate(settings, storage, lease, source, per_line)
        except Exception:
            log.exception("validation of %s failed; another attempt follows", lease.batch_id)
            batch_lease.release(settings, lease)
            return done
        log.info("batch %s validated: %s", lease.batch_id, status or "abandoned")
        done += 1
    return done
