"""Database tables. Wire shapes live in `app.schemas`; these are storage rows.

Public ids (`file-…`, `batch_…`) are unique strings; every table also has an
integer `seq` so that lists page in creation order with no ties.
Timestamps shown to users are Unix seconds (int); lease clocks are float seconds.

Importing this package registers every table on `Base.metadata` (Alembic's env reads it).
"""

from app.db.models.base import Base
from app.db.models.batches import Batch, ResultChunk, Shard, ShardAdapter
from app.db.models.files import File, Upload, UploadPart
from app.db.models.projects import (
    ApiKey,
    OnlineUsage,
    Project,
    ProjectLimit,
    ProjectShare,
    ProjectStepShare,
)
from app.db.models.schedules import BatchSchedule
from app.db.models.webhooks import WebhookDelivery, WebhookEndpoint
from app.db.models.workers import RegisteredWorker, SingletonLease

__all__ = [
    "ApiKey",
    "Base",
    "Batch",
    "BatchSchedule",
    "File",
    "OnlineUsage",
    "Project",
    "ProjectLimit",
    "ProjectShare",
    "ProjectStepShare",
    "RegisteredWorker",
    "ResultChunk",
    "Shard",
    "ShardAdapter",
    "SingletonLease",
    "Upload",
    "UploadPart",
    "WebhookDelivery",
    "WebhookEndpoint",
]
