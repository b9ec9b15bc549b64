"""What every table shares: the metadata's naming convention, the enum and CHECK helpers, the
partial-index helper and the public-id columns."""

from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import JSON, CheckConstraint, Enum, Index, Integer, MetaData, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def one_of(column: str, values: tuple[StrEnum, ...] | type[StrEnum]) -> str:
    """The SQL condition that `column` holds one of these enum values."""
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


def check_in(column: str, values: type[StrEnum]) -> CheckConstraint:
    """The CHECK constraint, named after `column`, that it holds one of the enum's values."""
    return CheckConstraint(one_of(column, values), name=column)


def enum_type(enum: type[StrEnum], length: int) -> Enum:
    """A `VARCHAR` holding the enum's values; the table's CHECK constraint guards it."""
    return Enum(
        enum,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
    )


def partial_index(name: str, *columns: str, where: str) -> Index:
    """An index of only the rows that meet `where`, on PostgreSQL and SQLite alike."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class PublicId:
    """A public id (`file-…`, `batch_…`) and the `seq` that pages lists in creation order."""

    # Mixin columns would come last; these stay the table's first two, as the migrations made them.
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, sort_order=-2)
    id: Mapped[str] = mapped_column(String(64), unique=True, sort_order=-1)
