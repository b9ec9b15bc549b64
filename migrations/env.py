"""Alembic environment: migrates whatever URL the caller put in the config, on the
connection the caller passed in `config.attributes["connection"]` if any (`upgrade` passes
the one that holds its lock)."""

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from app.db.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")


def run_migrations_offline() -> None:
    context.configure(
        url=url, target_metadata=Base.metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given: Connection | None = config.attributes.get("connection")
    if given is not None:
        _migrate(given)  # committed by the caller, which began its transaction
        return
    connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        _migrate(connection)


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
