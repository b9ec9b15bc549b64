"""The migrations build exactly the models' schema, on SQLite and PostgreSQL, and undo it."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

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


def test_batch_schedules_take_the_batches_scheduling_values_and_give_them_back(
    settings: Settings,
) -> None:
    """0016 moves each batch's clocks and ETAs into its `batch_schedules` row; its downgrade
    moves them back. Batches with shards: SQLite's rebuilt `batches` keeps its children."""
    url, before = settings.sqlalchemy_url, "0015_shard_adapters"
    command.downgrade(alembic_config(url), before)
    engine = engine_for(url)
    engine.dispose()
    values = {"work_done": 70, "vtime": 3.5, "urgent_deadline": 2000, "expected_miss": True}
    values |= {"eta_start_at": 10.5, "eta_finish_at": 20.5, "eta_made_at": 5.5}
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO projects (id, name, created_at, weight) VALUES ('p', 'p', 1, 1)")
        )
        conn.execute(
            text(
                "INSERT INTO files (id, project_id, filename, purpose, bytes, sha256, "
                "storage_key, status, created_at) VALUES "
                "('file-1', 'p', 'in.jsonl', 'batch', 0, '', 'k', 'processed', 1)"
            )
        )
        for batch_id, own in (("batch_a", values), ("batch_b", {})):
            columns = "".join(f", {name}" for name in own)
            given = "".join(f", :{name}" for name in own)
            conn.execute(
                text(
                    "INSERT INTO batches (id, project_id, endpoint, input_file_id, model, "
                    "completion_window, status, created_at, expires_at, total, completed, "
                    "failed, input_tokens, cached_tokens, output_tokens, reasoning_tokens, "
                    f"lease_epoch{columns}) VALUES (:id, 'p', '/v1/chat/completions', "
                    f"'file-1', 'm', '24h', 'in_progress', 1, 2000, 1, 0, 0, 0, 0, 0, 0, 0{given})"
                ),
                {"id": batch_id, **own},
            )
            conn.execute(
                text(
                    'INSERT INTO shards (batch_id, "index", first_line, line_count, byte_start, '
                    "byte_end, status, lease_epoch, attempts, completed, failed, input_tokens, "
                    "cached_tokens, output_tokens, reasoning_tokens) VALUES "
                    "(:id, 0, 1, 1, 0, 0, 'pending', 0, 0, 0, 0, 0, 0, 0, 0)"
                ),
                {"id": batch_id},
            )
    defaults = {name: None for name in values} | {"work_done": 0, "vtime": 0.0}
    defaults["expected_miss"] = False
    names = ", ".join(values)

    upgrade(url)
    engine.dispose()
    with engine.connect() as conn:
        moved = conn.execute(
            text(f"SELECT batch_id, {names} FROM batch_schedules ORDER BY batch_id")
        ).all()
        assert "work_done" not in {c["name"] for c in inspect(conn).get_columns("batches")}
        assert conn.execute(text("SELECT count(*) FROM shards")).scalar() == 2
    assert [(r[0], dict(zip(values, r[1:], strict=True))) for r in moved] == [
        ("batch_a", values),
        ("batch_b", defaults),
    ]

    command.downgrade(alembic_config(url), before)
    engine.dispose()
    with engine.connect() as conn:
        back = conn.execute(text(f"SELECT {names} FROM batches WHERE id = 'batch_a'")).one()
        assert "batch_schedules" not in inspect(conn).get_table_names()
    assert dict(zip(values, back, strict=True)) == values
