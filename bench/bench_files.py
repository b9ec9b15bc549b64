"""Files API benchmark: a 200 MB upload through the SDK, its download, and listing 10,000 files.

Runs the real server (`python -m app.cli api`) in a subprocess on a temporary data
directory, watches its resident memory with psutil, and prints a table.

    .venv/bin/python bench/bench_files.py [--mb 200] [--files 10000]

Targets on the 2-core CI machine: upload >= 150 MB/s, server RSS growth < 64 MB,
listing >= 2,000 objects/s.
"""

import argparse
import hashlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.db.session import session_scope  # noqa: E402
from app.services.auth import DEFAULT_PROJECT, ensure_project  # noqa: E402
from app.services.files import create_file_from_storage, file_storage_key  # noqa: E402
from app.storage import storage_for  # noqa: E402
from app.storage.base import put  # noqa: E402
from bench.server import api_server  # noqa: E402

MB = 1_000_000


class PeakRss:
    """Polls a process's RSS in a thread and keeps the peak; also counts its CPU time."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self) -> "PeakRss":
        self.baseline = self.process.memory_info().rss
        self._cpu_start = sum(self.process.cpu_times()[:2])
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cpu_seconds = sum(self.process.cpu_times()[:2]) - self._cpu_start
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.baseline) / MB


def make_jsonl(path: Path, size: int) -> str:
    """Request-like lines filling at most `size` bytes; returns the sha256."""
    digest = hashlib.sha256()
    written = 0
    with path.open("wb") as f:
        i = 0
        block = []
        while True:
            line = (
                b'{"custom_id": "request-%08d", "method": "POST", "url": "/v1/chat/completions", '
                b'"body": {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", '
                b'"content": "Say something about the number %d."}], "max_tokens": 16}}\n' % (i, i)
            )
            if written + len(line) > size:
                break
            block.append(line)
            written += len(line)
            i += 1
            if len(block) == 10_000:
                data = b"".join(block)
                f.write(data)
                digest.update(data)
                block.clear()
        data = b"".join(block)
        f.write(data)
        digest.update(data)
    return digest.hexdigest()


def seed_files(data_dir: Path, count: int) -> None:
    """Register `count` tiny files directly, as the server itself would."""
    settings = Settings(data_dir=data_dir, _env_file=None)  # type: ignore[call-arg]
    storage = storage_for(str(settings.storage_dir))
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        for i in range(count):
            file_id = f"file-bench{i:08d}"
            stored = put(storage, file_storage_key(file_id), [b'{"n": %d}\n' % i])
            create_file_from_storage(
                session,
                project_id=project_id,
                filename=f"{i}.jsonl",
                purpose="batch",
                stored=stored,
                expires_at=None,
                file_id=file_id,
            )


Row = tuple[str, str, str]


def bench_upload(
    client: openai.OpenAI, pid: int, source: Path, repeat: int
) -> tuple[str, list[Row]]:
    """Upload `repeat` times (best and median reported: the machine may be shared)."""
    size = source.stat().st_size
    speeds, growth, cpu = [], 0.0, []
    file_id = ""
    for i in range(repeat):
        with PeakRss(pid) as rss:
            start = time.perf_counter()
            created = client.files.create(file=source, purpose="batch")
            speeds.append(size / MB / (time.perf_counter() - start))
        assert created.bytes == size, created
        growth, file_id = max(growth, rss.growth_mb), created.id
        cpu.append(rss.cpu_seconds)
        if i < repeat - 1:
            client.files.delete(created.id)
    return file_id, [
        ("upload (SDK, multipart), best", f"{max(speeds):.0f} MB/s", ">= 150"),
        ("upload (SDK, multipart), median", f"{statistics.median(speeds):.0f} MB/s", ""),
        ("server CPU per upload, median", f"{statistics.median(cpu):.2f} s", ""),
        ("server RSS growth, upload (max)", f"{growth:.1f} MB", "< 64"),
    ]


def bench_download(client: openai.OpenAI, pid: int, file_id: str, sha256: str) -> list[Row]:
    with PeakRss(pid) as rss:
        start = time.perf_counter()
        digest, size = hashlib.sha256(), 0
        with client.files.with_streaming_response.content(file_id) as response:
            for chunk in response.iter_bytes(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        seconds = time.perf_counter() - start
    assert digest.hexdigest() == sha256
    return [
        ("download (SDK, streamed)", f"{size / MB / seconds:.0f} MB/s", ""),
        ("server RSS growth, download", f"{rss.growth_mb:.1f} MB", "< 64"),
    ]


def bench_list(client: openai.OpenAI, count: int) -> list[Row]:
    rows = []
    for limit in (100, 10_000):
        start = time.perf_counter()
        listed = sum(1 for _ in client.files.list(limit=limit))
        seconds = time.perf_counter() - start
        assert listed == count, listed
        rows.append(
            (
                f"list {listed} files, limit={limit}",
                f"{listed / seconds:,.0f} objects/s",
                ">= 2,000",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the uploaded file in MB")
    parser.add_argument("--files", type=int, default=10_000, help="files to list")
    parser.add_argument("--repeat", type=int, default=3, help="uploads to time")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-files-") as tmp:
        data_dir = Path(tmp)
        source = data_dir / "requests.jsonl"
        sha256 = make_jsonl(source, args.mb * MB)
        with api_server({"OVERNIGHT_DATA_DIR": str(data_dir)}) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="bench", max_retries=0)
            file_id, rows = bench_upload(client, server.pid, source, args.repeat)
            rows += bench_download(client, server.pid, file_id, sha256)
            client.files.delete(file_id)
            seed_files(data_dir, args.files)
            rows += bench_list(client, args.files)

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':>18}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>18}  {target}")


if __name__ == "__main__":
    main()
