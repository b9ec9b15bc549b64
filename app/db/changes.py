"""Whether anyone committed to the database since the last look: a check cheap enough to poll.

An idle worker wants to claim a shard the moment its batch goes in_progress, but a claim is a
write transaction (a few ms of CPU), too dear to run every few milliseconds. On SQLite,
`PRAGMA data_version` on a connection of its own changes whenever another connection commits,
and reading it takes microseconds and no lock in WAL mode: the worker looks at it often and
claims only when it moved. PostgreSQL has no such counter; there `watch_for` gives None and
the worker keeps to its claim poll.
"""

import sqlite3

SQLITE_PREFIX = "sqlite:///"


class ChangeWatch:
    """The database's change counter, as seen from a connection of the watch's own."""

    def __init__(self, path: str) -> None:
        # timeout=0: never wait on the event loop; a busy database reads as None (changed).
        self._connection = sqlite3.connect(path, timeout=0, isolation_level=None)

    def version(self) -> int | None:
        """Moves whenever another connection commits; None when it cannot be read now."""
        try:
            return int(self._connection.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None

    def close(self) -> None:
        self._connection.close()


def watch_for(url: str) -> ChangeWatch | None:
    """A watch on the SQLite file behind `url`; None where the database cannot tell."""
    path = url.removeprefix(SQLITE_PREFIX)
    if not url.startswith(SQLITE_PREFIX) or path in ("", ":memory:"):
        return None
    return ChangeWatch(path)
