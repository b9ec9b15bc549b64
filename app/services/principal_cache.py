"""The principals of recently used API keys, so that a request costs no key lookup.

An entry lives `ttl_seconds` from its lookup and is never renewed by use, so a key revoked
anywhere (another replica, `overnight keys revoke` on the database) is refused at most
`ttl_seconds` later; a revocation through this process empties the cache at once. Only keys
found in the database or the configured admin key are kept: open mode and refusals are
decided afresh on every request, so the cache never lets in anyone who would not be let in
without it.
"""

import time
from collections.abc import Callable

from app.services.auth import Principal, hash_key


class PrincipalCache:
    def __init__(
        self,
        ttl_seconds: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._clock = clock
        # sha256 of the key (the secret itself is not kept) -> (principal, expires at).
        self._entries: dict[str, tuple[Principal, float]] = {}

    def get(self, token: str) -> Principal | None:
        digest = hash_key(token)
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._entries.pop(digest, None)
            return None
        return entry[0]

    def put(self, token: str, principal: Principal) -> None:
        if self.ttl_seconds <= 0:
            return
        if len(self._entries) >= self.max_entries:
            # The oldest lookup goes first (dicts keep insertion order).
            self._entries.pop(next(iter(self._entries)))
        self._entries[hash_key(token)] = (principal, self._clock() + self.ttl_seconds)

    def clear(self) -> None:
        self._entries.clear()
