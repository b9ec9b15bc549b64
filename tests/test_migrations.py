"""The migrations build exactly the models' schema, on SQLite and PostgreSQL, and undo it."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.config import Settings
from app.db.models import Base
from app.db.session import alembic_config, engine_for, upgrade


def test_upgrade_matches_models_and_downgrade_empties(settings: Settings) -> None:
    url = settings.sqlalchemy_url
    upgrade(url)
    engine = engine_for(url)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        tables = set(inspect(conn).get_table_names())
    assert diffs == []
    assert set(Base.metadata.tables) <= tables

    command.downgrade(alembic_config(url), "base")
    engine.dispose()
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}

    upgrade(url)  # and back again
    engine.dispose()
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
