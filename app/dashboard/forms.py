"""What the dashboard's query strings and forms parse into."""

from typing import Annotated

from fastapi import Depends, Query
from pydantic import BaseModel, ValidationInfo, field_validator

from app.dashboard import content
from app.schemas.admin import UpdateEnqueuedLimitsRequest, UpdateProjectQuotasRequest


def batch_query(
    status: str = "",
    project: str = "",
    q: str = "",
    custom_id: str = "",
    date_from: Annotated[str, Query(alias="from")] = "",
    date_to: Annotated[str, Query(alias="to")] = "",
    after: str = "",
    limit: Annotated[int, Query(ge=1, le=content.PAGE_SIZE)] = content.PAGE_SIZE,
) -> content.BatchQuery:
    """The batch list's query string; `after` and `limit` as in the API's list."""
    return content.BatchQuery(
        status, project, q, custom_id.strip(), date_from, date_to, after, limit
    )


BatchQueryDep = Annotated[content.BatchQuery, Depends(batch_query)]


class BlankIsDefault(BaseModel):
    """A form's blank optional field is null: the deployment's default."""

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_default(cls, value: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        return None if value == "" and field and not field.is_required() else value


class LimitsForm(BlankIsDefault, UpdateEnqueuedLimitsRequest):
    """The projects table's limits form."""


class QuotasForm(BlankIsDefault, UpdateProjectQuotasRequest):
    """The projects table's quotas form."""
