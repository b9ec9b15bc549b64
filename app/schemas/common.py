"""Wire shapes shared by every resource: list and delete envelopes, expiry, tolerant requests."""

import logging
from enum import StrEnum
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

log = logging.getLogger("overnight.api")

ItemT = TypeVar("ItemT", bound=BaseModel)

SortOrder = Literal["asc", "desc"]

MIN_EXPIRES_AFTER_SECONDS = 3600
MAX_EXPIRES_AFTER_SECONDS = 2_592_000


def inline_enum(enum: type[StrEnum], title: str) -> WithJsonSchema:
    """An enum field described in place, as OpenAI's spec does, not as a shared component."""
    return WithJsonSchema({"type": "string", "enum": [m.value for m in enum], "title": title})


class RequestModel(BaseModel):
    """A request body: unknown fields are accepted and logged, never rejected."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_unknown_fields(self) -> "RequestModel":
        if self.model_extra:
            log.info("ignoring unknown request fields: %s", sorted(self.model_extra))
        return self


class ExpiresAfter(BaseModel):
    """OpenAI's `FileExpirationAfter`: expire `seconds` after the object's creation."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRES_AFTER_SECONDS, le=MAX_EXPIRES_AFTER_SECONDS)


class ListObject(BaseModel, Generic[ItemT]):
    """A cursor page: `first_id`/`last_id` mirror `data` and are null for an empty page."""

    object: Literal["list"] = "list"
    data: list[ItemT]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, data: list[ItemT], has_more: bool) -> "ListObject[ItemT]":
        ids = [getattr(item, "id", None) for item in data]
        return cls(
            data=data,
            first_id=ids[0] if ids else None,
            last_id=ids[-1] if ids else None,
            has_more=has_more,
        )


class DeletedObject(BaseModel):
    """OpenAI's delete envelope, e.g. `{"id": "file-…", "object": "file", "deleted": true}`."""

    id: str
    object: str
    deleted: bool = True
