"""Local storage: atomic writes, ranged streaming reads, safe keys, crash leftovers."""

import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage import LocalStorage
from app.storage.base import put


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "store")


def test_put_read_and_ranges(storage: LocalStorage) -> None:
    data = os.urandom(3 * (1 << 20) + 123)
    stored = put(storage, "files/a", [data[:1000], data[1000:]])
    assert (stored.key, stored.bytes, stored.sha256) == (
        "files/a",
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    chunks = list(storage.read("files/a"))
    assert len(chunks) > 1 and max(map(len, chunks)) <= 1 << 20
    assert b"".join(chunks) == data
    assert b"".join(storage.read("files/a", 10, 2_000_000)) == data[10:2_000_000]
    assert b"".join(storage.read("files/a", len(data) - 5)) == data[-5:]
    assert storage.size("files/a") == len(data)
    assert list(storage.list("files/")) == ["files/a"]
    storage.delete("files/a")
    storage.delete("files/a")  # missing is fine
    assert not storage.exists("files/a")


def test_nothing_is_visible_before_commit(storage: LocalStorage) -> None:
    writer = storage.writer("files/b")
    writer.write(b"half")
    assert not storage.exists("files/b")
    assert list(storage.list("")) == []
    writer.write(b" and the rest")
    assert writer.commit().bytes == len(b"half and the rest")
    assert b"".join(storage.read("files/b")) == b"half and the rest"

    # Overwriting is atomic too: readers see the old or the new object, never a mix.
    replacing = storage.writer("files/b")
    replacing.write(b"new")
    assert b"".join(storage.read("files/b")) == b"half and the rest"
    replacing.commit()
    assert b"".join(storage.read("files/b")) == b"new"


def test_abort_leaves_nothing(storage: LocalStorage) -> None:
    writer = storage.writer("files/c")
    writer.write(b"x" * 10_000)
    writer.abort()
    assert not storage.exists("files/c")
    assert list(storage.tmp_dir.iterdir()) == []

    with pytest.raises(RuntimeError):
        put(storage, "files/d", _failing_chunks())
    assert not storage.exists("files/d")
    assert list(storage.tmp_dir.iterdir()) == []


def _failing_chunks() -> Iterator[bytes]:
    yield b"some"
    raise RuntimeError("the client went away")


def test_a_killed_writer_leaves_only_an_unlisted_temp_file(storage: LocalStorage) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from app.storage import LocalStorage
        writer = LocalStorage({str(storage.root)!r}).writer("files/killed")
        writer.write(b"x" * 100_000)
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    assert done.returncode == -9
    assert not storage.exists("files/killed")
    assert list(storage.list("")) == [] and list(storage.list("files/")) == []
    leftovers = list(storage.tmp_dir.iterdir())
    assert len(leftovers) == 1
    assert storage.sweep_temp(older_than_seconds=3600) == 0
    os.utime(leftovers[0], (0, 0))
    assert storage.sweep_temp(older_than_seconds=3600) == 1
    assert list(storage.tmp_dir.iterdir()) == []


@pytest.mark.parametrize(
    "key", ["../x", "files/../../x", "/etc/passwd", "files/a b", "files/\u00e9", "", ".tmp/../x"]
)
def test_unsafe_keys_are_refused(storage: LocalStorage, key: str) -> None:
    with pytest.raises(ValueError):
        storage.writer(key)
    with pytest.raises(ValueError):
        storage.delete(key)
