"""A worker with LoRA prefers shards whose adapters it has loaded, within the batch that comes
first: validation records each shard's adapters (`shard_adapters`), the claim reads them.

Batches go through the real validator (the adapters announced by a worker's row, as a vLLM
worker announces them) and the real claim statement, on SQLite and PostgreSQL.
"""

from collections.abc import Collection, Iterator

import pytest
from sqlalchemy import Dialect, select
from sqlalchemy.dialects import postgresql, sqlite

from app.config import Settings
from app.core.schedule import Order
from app.db.models import Shard, ShardAdapter
from app.db.session import session_scope
from app.endpoints import GENERATIVE
from app.services import prune_rows
from app.services.steps.validation import validate_pending
from tests.batch_sim import MODEL, jsonl, request_line
from tests.fake_engine import FakeEngine
from tests.test_served_names import announce
from tests.test_validation import create
from worker import claim
from worker.loop import Worker, WorkerOptions

LEASE = 30.0
ADAPTERS = ["a", "b"]


@pytest.fixture
def db(settings: Settings) -> Iterator[Settings]:
    """A deployment whose worker serves MODEL with the adapters "a" and "b"; shards of 2 lines."""
    settings = settings.model_copy(update={"shard_lines": 2})
    adapters = [{"name": name, "parent": MODEL, "root": f"/adapters/{name}"} for name in ADAPTERS]
    announce(settings, "lora-worker", [MODEL], GENERATIVE, adapters)
    yield settings


def validated(settings: Settings, models: list[str]) -> str:
    """An in_progress batch whose lines name `models` in turn (2 lines a shard)."""
    lines = [request_line(f"line-{i}", model=model) for i, model in enumerate(models)]
    batch_id = create(settings, jsonl(lines))
    assert validate_pending(settings, "test-validator") == 1
    return batch_id


def adapters_by_index(settings: Settings, batch_id: str) -> dict[int, list[str]]:
    with session_scope(settings) as session:
        rows = session.execute(
            select(Shard.index, ShardAdapter.name)
            .join(ShardAdapter, ShardAdapter.shard_id == Shard.id)
            .where(Shard.batch_id == batch_id)
            .order_by(Shard.index, ShardAdapter.name)
        ).all()
    found: dict[int, list[str]] = {}
    for index, name in rows:
        found.setdefault(index, []).append(name)
    return found


def claims(
    settings: Settings, n: int, loaded: Collection[str] | None, order: Order = Order.FAIR
) -> list[tuple[str, int]]:
    """The (batch, shard index) of the next `n` claims of a worker holding `loaded`."""
    taken = []
    for _ in range(n):
        with session_scope(settings) as session:
            lease = claim.claim_shard(session, "w", [MODEL], LEASE, order, loaded)
        assert lease is not None
        taken.append((lease.batch_id, lease.index))
    return taken


# Shard 0: base and "b"; 1: "b" only; 2: base and "a"; 3: base only; 4: "a" and "b".
MIXED = [MODEL, "b", "b", "b", MODEL, "a", MODEL, MODEL, "a", "b"]


def test_validation_records_the_adapters_each_shard_names(db: Settings) -> None:
    batch_id = validated(db, MIXED)
    assert adapters_by_index(db, batch_id) == {0: ["b"], 1: ["b"], 2: ["a"], 4: ["a", "b"]}
    with session_scope(db) as session:
        assert len(session.scalars(select(Shard).where(Shard.batch_id == batch_id)).all()) == 5


def test_a_batch_of_the_base_model_records_no_adapters(db: Settings) -> None:
    validated(db, [MODEL] * 5)
    with session_scope(db) as session:
        assert session.scalars(select(ShardAdapter)).all() == []


@pytest.mark.parametrize("order", list(Order))
def test_loaded_adapters_come_first_within_the_batch(db: Settings, order: Order) -> None:
    batch_id = validated(db, MIXED)
    # Shards needing no load ("a" loaded: 2 and 3) before those naming "b", each in index order.
    assert claims(db, 5, {"a"}, order) == [(batch_id, i) for i in (2, 3, 0, 1, 4)]


def test_without_lora_the_claim_takes_index_order(db: Settings) -> None:
    batch_id = validated(db, MIXED)
    assert claims(db, 5, None) == [(batch_id, i) for i in range(5)]


def test_with_no_adapter_loaded_base_shards_come_first(db: Settings) -> None:
    batch_id = validated(db, MIXED)
    assert claims(db, 5, set()) == [(batch_id, i) for i in (3, 0, 1, 2, 4)]


@pytest.mark.parametrize("order", list(Order))
def test_a_higher_ranked_batch_still_comes_first(db: Settings, order: Order) -> None:
    # The older batch names only "b": its shards still go first, loaded adapters or not.
    first = validated(db, ["b"] * 4)
    second = validated(db, ["a"] * 4)
    expected = [(first, 0), (first, 1), (second, 0), (second, 1)]
    assert claims(db, 4, {"a"}, order) == expected


def test_pruned_batch_rows_take_their_adapters(db: Settings) -> None:
    batch_id = validated(db, MIXED)
    with session_scope(db) as session:
        assert prune_rows.delete_batch_rows(session, [batch_id]) == 5
        assert session.scalars(select(ShardAdapter)).all() == []


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()])
def test_the_claim_without_lora_never_reads_shard_adapters(dialect: Dialect) -> None:
    # A worker without LoRA runs the statement it ran before adapters were recorded.
    for order in Order:
        assert "shard_adapters" not in str(claim.claim_statement(order).compile(dialect=dialect))
        lora = claim.claim_statement(order, lora=True)
        assert "shard_adapters" in str(lora.compile(dialect=dialect))


def test_an_adapter_shard_alone_is_still_claimed(db: Settings) -> None:
    # Preferences only reorder: a shard whose adapter is not loaded is taken when it is all
    # there is.
    batch_id = validated(db, ["b"] * 2)
    assert claims(db, 1, {"a"}) == [(batch_id, 0)]


class LoraEngine(FakeEngine):
    """A scripted engine with LoRA on, holding the adapter "a"."""

    def loaded_adapters(self) -> frozenset[str] | None:
        return frozenset({"a"})


@pytest.mark.parametrize(("engine", "first"), [(LoraEngine(), 2), (FakeEngine(), 0)])
def test_the_worker_claims_with_its_engines_adapters(
    db: Settings, engine: FakeEngine, first: int
) -> None:
    batch_id = validated(db, MIXED)
    worker = Worker(db, engine, WorkerOptions(worker_id="w"))
    lease = worker._take_shard(worker._loaded_adapters())
    assert lease is not None and (lease.batch_id, lease.index) == (batch_id, first)
