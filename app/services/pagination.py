"""Cursor pagination in creation order, shared by every list endpoint.

Rows are ordered by their integer `seq` (creation order without ties); the cursor
`after` is a public id and is exclusive. The cursor is looked up within the
caller's scope only, so another project's id is as unknown as a made-up one, but a
cursor object deleted since the previous page still works.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from app.errors import OpenAIError
from app.schemas.common import Order

RowT = TypeVar("RowT")


@dataclass(frozen=True)
class Page(Generic[RowT]):
    rows: Sequence[RowT]
    has_more: bool


def check_limit(limit: int, maximum: int) -> None:
    """OpenAI's messages for a `limit` out of `[1, maximum]`."""
    if limit < 1:
        raise OpenAIError(
            f"Invalid 'limit': integer below minimum value. Expected a value >= 1, but got "
            f"{limit} instead.",
            param="limit",
            code="integer_below_min_value",
        )
    if limit > maximum:
        raise OpenAIError(
            f"Invalid 'limit': integer above maximum value. Expected a value <= {maximum}, but "
            f"got {limit} instead.",
            param="limit",
            code="integer_above_max_value",
        )


def paginate(
    session: Session,
    model: type[Any],
    *,
    scope: Sequence[ColumnElement[bool]],
    visible: Sequence[ColumnElement[bool]] = (),
    after: str | None,
    limit: int,
    order: Order,
) -> Page[Any]:
    """One page of `model` rows (a table with `id` and `seq`), after the row `after`.

    `scope` (e.g. the project) also bounds the cursor lookup; `visible` (e.g. not
    deleted, a purpose filter) only filters the page.
    """
    stmt = select(model).where(*scope, *visible)
    if after is not None:
        cursor = session.scalar(select(model.seq).where(*scope, model.id == after))
        if cursor is None:
            raise OpenAIError(
                f"Invalid 'after': no object with id '{after}' to page after.",
                param="after",
                code="invalid_value",
            )
        stmt = stmt.where(model.seq < cursor if order == "desc" else model.seq > cursor)
    ordering = model.seq.desc() if order == "desc" else model.seq.asc()
    rows = session.scalars(stmt.order_by(ordering).limit(limit + 1)).all()
    return Page(rows[:limit], has_more=len(rows) > limit)
