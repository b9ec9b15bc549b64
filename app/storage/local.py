"""Storage in a local directory: temp file + fsync + rename makes each write atomic."""

import contextlib
import errno
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from app.storage.base import (
    READ_CHUNK,
    HashingWriter,
    ListedObject,
    StorageFull,
    check_key,
)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _full(root: Path, exc: OSError) -> StorageFull:
    return StorageFull(f"the file store at {root} is full ({exc.strerror})")


class LocalWriter(HashingWriter):
    def __init__(self, storage: "LocalStorage", key: str) -> None:
        super().__init__(key)
        self._root = storage.root
        self._final = storage.path(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=storage.tmp_dir, prefix="w-")
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise _full(self._root, exc) from exc
            raise
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            self._refused(exc)

    def _persist(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._tmp, self._final)
        except OSError as exc:
            self._refused(exc)

    def abort(self) -> None:
        # A full disk may refuse even the buffered bytes a close flushes: the file goes anyway.
        with contextlib.suppress(OSError):
            self._file.close()
        self._tmp.unlink(missing_ok=True)

    def _refused(self, exc: OSError) -> None:
        """Frees what the temp file holds, and names a full store for what it is."""
        self.abort()
        if exc.errno in _NO_SPACE:
            raise _full(self._root, exc) from exc
        raise exc


class LocalStorage:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.tmp_dir = self.root / ".tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def writer(self, key: str) -> LocalWriter:
        self.path(key)
        return LocalWriter(self, key)

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        with open(self.path(key), "rb") as f:
            f.seek(start)
            remaining = None if end is None else end - start
            while remaining is None or remaining > 0:
                size = READ_CHUNK if remaining is None else min(READ_CHUNK, remaining)
                data = f.read(size)
                if not data:
                    return
                if remaining is not None:
                    remaining -= len(data)
                yield data

    def size(self, key: str) -> int:
        return self.path(key).stat().st_size

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def list(self, prefix: str) -> Iterator[str]:
        base = self.root / prefix
        folder = base if base.is_dir() else base.parent
        if not folder.is_dir():
            return
        for path in sorted(folder.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not key.startswith(".tmp/"):
                yield key

    def scan(self, folder: str, start_after: str = "") -> Iterator[ListedObject]:
        check_key(folder)
        return _walk(self.root / folder, folder, start_after)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def sweep_temp(self, older_than_seconds: float) -> int:
        """Remove temp files a crashed writer left behind."""
        cutoff = time.time() - older_than_seconds
        removed = 0
        for path in self.tmp_dir.iterdir():
            if path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed


def _walk(directory: Path, key_prefix: str, start_after: str) -> Iterator[ListedObject]:
    """The files under `directory` in key order, after `start_after`: a folder sorts as its
    name plus "/", as its keys do, and one whose keys all come before is not entered."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    named = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in entries]
    for name, entry in sorted(named, key=lambda pair: pair[0]):
        key = key_prefix + name
        if name.endswith("/"):
            if key > start_after or start_after.startswith(key):
                yield from _walk(Path(entry.path), key, start_after)
        elif key > start_after:
            with contextlib.suppress(FileNotFoundError):  # deleted since the folder was read
                yield ListedObject(key, entry.stat(follow_symlinks=False).st_mtime)
