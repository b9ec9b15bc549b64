"""Cursor pagination in creation order, shared by every list endpoint.

Rows are ordered by their integer `seq` (creation order without ties); the cursor
`after` is a public id and is exclusive. The cursor is looked up within the caller's
scope only (in the page's own query), so another project's id is as unknown as a made-up
one, but a cursor object deleted since the previous page still works.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Integer, Select, bindparam, select
from sqlalchemy.orm import Session

from app.errors import OpenAIError
from app.schemas.common import SortOrder

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


class Pages:
    """The page queries of one list: `model` rows (a table with `id` and `seq`), or with
    `query` (a select from `model`'s table) its Core rows.

    `scope` (e.g. the project) also bounds the cursor lookup; `visible` (e.g. not deleted)
    only filters the page. Both are written with bind parameters, whose values each call
    passes: the statements are built once, as building one (and matching a cached
    compilation to it) costs more than running it on a warm connection.
    """

    def __init__(
        self,
        model: type[Any],
        *,
        query: Select[*tuple[Any, ...]] | None = None,
        scope: Sequence[ColumnElement[bool]],
        visible: Sequence[ColumnElement[bool]] = (),
    ) -> None:
        self._model = model
        self._entities = query is None
        self._base = (select(model) if query is None else query).where(*scope, *visible)
        self._cursor = select(model.seq).where(*scope, model.id == bindparam("after"))
        self._statements: dict[tuple[SortOrder, bool], Select[*tuple[Any, ...]]] = {}

    def _statement(self, order: SortOrder, after: bool) -> Select[*tuple[Any, ...]]:
        stmt = self._statements.get((order, after))
        if stmt is None:
            seq = self._model.seq
            stmt = self._base
            if after:
                cursor = self._cursor.scalar_subquery()
                stmt = stmt.where(seq < cursor if order == "desc" else seq > cursor)
            ordering = seq.desc() if order == "desc" else seq.asc()
            stmt = stmt.order_by(ordering).limit(bindparam("page_limit", type_=Integer))
            self._statements[(order, after)] = stmt
        return stmt

    def page(
        self,
        session: Session,
        params: dict[str, Any],
        *,
        after: str | None,
        limit: int,
        order: SortOrder,
    ) -> Page[Any]:
        """The page after the row `after` (exclusive); `params` are the bind values."""
        values = {**params, "after": after, "page_limit": limit + 1}
        stmt = self._statement(order, after is not None)
        rows: Sequence[Any] = (
            session.scalars(stmt, values).all()
            if self._entities
            else session.connection().execute(stmt, values).all()
        )
        if not rows and after is not None and session.scalar(self._cursor, values) is None:
            raise OpenAIError(
                f"Invalid 'after': no object with id '{after}' to page after.",
                param="after",
                code="invalid_value",
            )
        return Page(rows[:limit], has_more=len(rows) > limit)
