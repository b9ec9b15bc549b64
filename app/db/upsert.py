"""`INSERT … ON CONFLICT` in the session's dialect: SQLite and PostgreSQL spell it alike."""

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert(session: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    """An insert into `table` (a model or a table) that takes `on_conflict_do_*`."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
