"""The principal cache's own rules: a fixed lifetime from the lookup, a bounded size."""

from app.services.auth import Principal
from app.services.principal_cache import PrincipalCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_its_ttl_from_the_lookup_and_use_does_not_renew_it() -> None:
    clock = Clock()
    cache = PrincipalCache(ttl_seconds=5, clock=clock)
    alice = Principal("proj_a", "member")
    cache.put("sk-alice", alice)
    for _ in range(4):
        clock.now += 1.2
        assert cache.get("sk-alice") == alice
    clock.now += 0.2  # 5.0 s after the lookup
    assert cache.get("sk-alice") is None
    assert cache.get("sk-bob") is None


def test_clear_forgets_every_key_and_no_ttl_keeps_nothing() -> None:
    cache = PrincipalCache(ttl_seconds=5)
    cache.put("sk-alice", Principal("proj_a", "admin"))
    cache.clear()
    assert cache.get("sk-alice") is None
    off = PrincipalCache(ttl_seconds=0)
    off.put("sk-alice", Principal("proj_a", "admin"))
    assert off.get("sk-alice") is None


def test_the_oldest_lookup_is_dropped_past_max_entries() -> None:
    cache = PrincipalCache(ttl_seconds=60, max_entries=3)
    for i in range(4):
        cache.put(f"sk-{i}", Principal(f"proj_{i}", "member"))
    assert cache.get("sk-0") is None
    assert [cache.get(f"sk-{i}") for i in (1, 2, 3)] == [
        Principal(f"proj_{i}", "member") for i in (1, 2, 3)
    ]
    assert len(cache._entries) == 3


def test_the_secret_itself_is_not_kept() -> None:
    cache = PrincipalCache(ttl_seconds=60)
    cache.put("sk-secret-value", Principal("proj_a", "member"))
    assert "sk-secret-value" not in repr(cache._entries)
