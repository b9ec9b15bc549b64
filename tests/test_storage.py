"""Storage backends pass one contract: atomic writes, ranged streaming reads, safe keys,
crash leftovers swept. Local runs on a directory, S3 on a real S3 server (moto)."""

import hashlib
import itertools
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import httpx
import openai
import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from app.config import Settings
from app.core.chunks import chunk_key
from app.services.files import file_storage_key
from app.services.uploads import part_storage_prefix
from app.storage import LocalStorage, Storage, storage_for
from app.storage.base import KEY_FOLDERS, put
from app.storage.s3 import PART_SIZE, S3Storage
from tests.harness import running_server

MiB = 1 << 20


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "store")
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket: str = request.getfixturevalue("s3_bucket")
    # An object beside the prefix, which the store must neither list nor touch.
    boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key="other", Body=b"x")
    return S3Storage(bucket, "deploy/", endpoint)


def leftovers(storage: Storage) -> list[str]:
    """What a writer that never committed left behind: temp files or open multipart uploads."""
    if isinstance(storage, LocalStorage):
        return [p.name for p in storage.tmp_dir.iterdir()]
    assert isinstance(storage, S3Storage)
    listed = storage.client.list_multipart_uploads(Bucket=storage.bucket)
    return [upload["Key"] for upload in listed.get("Uploads", [])]


def leftover_started_at(storage: Storage) -> float:
    """When the store says the one leftover was started (a temp file's mtime, an upload's start)."""
    if isinstance(storage, LocalStorage):
        (path,) = storage.tmp_dir.iterdir()
        return path.stat().st_mtime
    assert isinstance(storage, S3Storage)
    (upload,) = storage.client.list_multipart_uploads(Bucket=storage.bucket)["Uploads"]
    return upload["Initiated"].timestamp()


def location(storage: Storage) -> tuple[str, str | None]:
    """The `storage_for` arguments that reach the same store."""
    if isinstance(storage, LocalStorage):
        return str(storage.root), None
    assert isinstance(storage, S3Storage)
    return f"s3://{storage.bucket}/{storage.prefix}", storage.client.meta.endpoint_url


def test_put_read_and_ranges(storage: Storage) -> None:
    data = os.urandom(3 * MiB + 123)
    stored = put(storage, "files/a", [data[:1000], data[1000:]])
    assert (stored.key, stored.bytes, stored.sha256) == (
        "files/a",
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    chunks = list(storage.read("files/a"))
    assert len(chunks) > 1 and max(map(len, chunks)) <= MiB
    assert b"".join(chunks) == data
    assert b"".join(storage.read("files/a", 10, 2_000_000)) == data[10:2_000_000]
    assert b"".join(storage.read("files/a", len(data) - 5)) == data[-5:]
    assert b"".join(storage.read("files/a", 7, 7)) == b""
    assert b"".join(storage.read("files/a", len(data) + 10)) == b""
    assert storage.size("files/a") == len(data)
    assert list(storage.list("files/")) == ["files/a"]
    storage.delete("files/a")
    storage.delete("files/a")  # missing is fine
    assert not storage.exists("files/a")


def test_nothing_is_visible_before_commit(storage: Storage) -> None:
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


def test_abort_leaves_nothing(storage: Storage) -> None:
    writer = storage.writer("files/c")
    writer.write(os.urandom(PART_SIZE + 10_000))  # past one part: S3 has an upload open
    assert leftovers(storage)
    writer.abort()
    assert not storage.exists("files/c")
    assert leftovers(storage) == []

    with pytest.raises(RuntimeError):
        put(storage, "files/d", _failing_chunks())
    assert not storage.exists("files/d")
    assert leftovers(storage) == []


def _failing_chunks() -> Iterator[bytes]:
    yield os.urandom(PART_SIZE + 1)
    raise RuntimeError("the client went away")


def _uneven(data: bytes) -> Iterator[bytes]:
    sizes = itertools.cycle([1, 777_777, 3 * MiB + 5, 123, 5 * MiB - 1, 65_536])
    at = 0
    while at < len(data):
        size = next(sizes)
        yield data[at : at + size]
        at += size


def test_an_object_of_many_parts(storage: Storage) -> None:
    data = os.urandom(20 * MiB + 17)  # random: parts out of order or repeated would show
    writer = storage.writer("files/big")
    for chunk in _uneven(data):
        writer.write(chunk)
    assert writer.bytes_written == len(data)
    assert not storage.exists("files/big")
    stored = writer.commit()
    assert (stored.bytes, stored.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert storage.size("files/big") == len(data)
    assert leftovers(storage) == []
    assert hashlib.sha256(b"".join(storage.read("files/big"))).digest() == (
        hashlib.sha256(data).digest()
    )
    for start, end in [
        (PART_SIZE - 10, PART_SIZE + 10),
        (PART_SIZE - 1, 2 * PART_SIZE + 1),
        (2 * PART_SIZE, None),
        (0, 1),
    ]:
        assert b"".join(storage.read("files/big", start, end)) == data[start:end]
    if isinstance(storage, S3Storage):
        head = storage.client.head_object(Bucket=storage.bucket, Key="deploy/files/big")
        assert head["ETag"].strip('"').endswith("-3")  # 8 + 8 + 4 MiB, one multipart upload


def test_list_delete_exists_size(storage: Storage) -> None:
    for key in ["files/b", "files/a", "files/ab/c", "uploads/u1/part_1"]:
        put(storage, key, [key.encode()])
    put(storage, "empty", [])
    assert sorted(storage.list("")) == [
        "empty",
        "files/a",
        "files/ab/c",
        "files/b",
        "uploads/u1/part_1",
    ]
    assert sorted(storage.list("files/")) == ["files/a", "files/ab/c", "files/b"]
    assert sorted(storage.list("files/a")) == ["files/a", "files/ab/c"]
    assert list(storage.list("uploads/u1/")) == ["uploads/u1/part_1"]
    assert list(storage.list("nothing/")) == []
    assert (storage.size("files/ab/c"), storage.size("empty")) == (len(b"files/ab/c"), 0)
    assert b"".join(storage.read("empty")) == b""
    assert storage.exists("files/a") and not storage.exists("files/z")
    with pytest.raises(FileNotFoundError):
        storage.size("files/z")
    with pytest.raises(FileNotFoundError):
        list(storage.read("files/z"))
    storage.delete("files/a")
    storage.delete("files/z")
    assert sorted(storage.list("files/")) == ["files/ab/c", "files/b"]


@pytest.mark.parametrize(
    "key", ["../x", "files/../../x", "/etc/passwd", "files/a b", "files/\u00e9", "", ".tmp/../x"]
)
def test_unsafe_keys_are_refused(storage: Storage, key: str) -> None:
    with pytest.raises(ValueError):
        storage.writer(key)
    with pytest.raises(ValueError):
        storage.delete(key)
    with pytest.raises(ValueError):
        storage.exists(key)


def test_a_killed_writer_leaves_only_what_sweep_removes(storage: Storage) -> None:
    where, endpoint = location(storage)
    script = textwrap.dedent(
        f"""
        import os
        from app.storage import storage_for
        writer = storage_for({where!r}, {endpoint!r}).writer("files/killed")
        writer.write(os.urandom({PART_SIZE + 100_000}))
        os.kill(os.getpid(), 9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    assert done.returncode == -9
    assert not storage.exists("files/killed")
    assert list(storage.list("")) == [] and list(storage.list("files/")) == []
    assert len(leftovers(storage)) == 1
    # The age as the store reports it (moto dates every upload in 2010), so both sides count.
    age = time.time() - leftover_started_at(storage)
    assert storage.sweep_temp(older_than_seconds=age + 3600) == 0
    assert len(leftovers(storage)) == 1
    time.sleep(1.1)  # S3 reports an upload's start in whole seconds
    assert storage.sweep_temp(older_than_seconds=1) == 1
    assert leftovers(storage) == []


def test_the_sweep_ends_only_overnights_own_uploads(s3_endpoint: str, s3_bucket: str) -> None:
    # A bucket shared with other applications, overnight at its root (no prefix).
    storage = S3Storage(s3_bucket, "", s3_endpoint)
    ours = ["files/left-by-a-dead-writer", "uploads/upload_x/part_1", "batches/b/shards/1"]
    theirs = ["backups/nightly.tar", "files-of-another-app/x", "other"]
    for key in ours + theirs:
        storage.client.create_multipart_upload(Bucket=s3_bucket, Key=key)
    time.sleep(1.1)  # S3 reports an upload's start in whole seconds
    assert storage.sweep_temp(older_than_seconds=1) == len(ours)
    assert sorted(leftovers(storage)) == sorted(theirs)
    # Every key overnight makes lies in a swept folder.
    made = [file_storage_key("file-x"), part_storage_prefix("upload_x"), chunk_key("b", 0, 1, 2)]
    assert all(key.startswith(KEY_FOLDERS) for key in made), made


def test_storage_for_picks_the_backend(tmp_path: Path, s3_endpoint: str) -> None:
    local = storage_for(str(tmp_path / "a"))
    assert isinstance(local, LocalStorage) and local.root == (tmp_path / "a").resolve()
    s3 = storage_for("s3://bucket/some/prefix/", s3_endpoint)
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix) == ("bucket", "some/prefix/")
    assert s3.client.meta.endpoint_url == s3_endpoint
    assert storage_for("s3://bucket/some/prefix/", s3_endpoint) is s3
    whole = storage_for("s3://bucket", s3_endpoint)
    assert isinstance(whole, S3Storage) and whole.prefix == ""


def test_settings_storage_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    assert plain.storage_location == str(tmp_path / "storage")
    monkeypatch.setenv("OVERNIGHT_STORAGE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("OVERNIGHT_S3_ENDPOINT_URL", "http://minio:9000")
    s3 = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    assert (s3.storage_location, s3.s3_endpoint_url) == ("s3://bucket/prefix", "http://minio:9000")
    for bad in ["/srv/data", "s3://", "s3:///prefix", "s3://bucket/../x", "s3://b/a b"]:
        monkeypatch.setenv("OVERNIGHT_STORAGE_URL", bad)
        with pytest.raises(ValidationError):
            Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]


def test_the_api_keeps_files_in_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, s3_bucket: str
) -> None:
    monkeypatch.setenv("OVERNIGHT_STORAGE_URL", f"s3://{s3_bucket}/deploy")
    monkeypatch.setenv("OVERNIGHT_S3_ENDPOINT_URL", s3_endpoint)
    # One housekeeping pass, at start: moto dates every upload in 2010, so a later sweep
    # would abort the upload this test makes.
    monkeypatch.setenv("OVERNIGHT_HOUSEKEEPING_INTERVAL_SECONDS", "3600")
    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    bucket = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket.create_multipart_upload(Bucket=s3_bucket, Key="deploy/files/left-by-a-dead-writer")
    # Over one part, so the upload route streams a multipart upload.
    lines = (b'{"custom_id": "r%d", "method": "POST", "n": %d}\n' % (i, i) for i in range(250_000))
    data = b"".join(lines)
    assert len(data) > PART_SIZE
    with (
        running_server(settings) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        _wait_for(lambda: not bucket.list_multipart_uploads(Bucket=s3_bucket).get("Uploads"))
        created = client.files.create(file=("requests.jsonl", data), purpose="batch")
        assert created.bytes == len(data)
        assert client.files.content(created.id).content == data
        name = "deploy/" + file_storage_key(created.id)
        head = bucket.head_object(Bucket=s3_bucket, Key=name)
        assert head["ContentLength"] == len(data)
        assert "-" in head["ETag"]  # a multipart upload's ETag
        assert not (settings.storage_dir / "files").exists()

        assert client.files.delete(created.id).deleted
        with pytest.raises(ClientError) as missing:
            bucket.head_object(Bucket=s3_bucket, Key=name)
        assert missing.value.response["Error"]["Code"] == "404"

        probe = httpx.get(server.url + "/readyz", timeout=30)
        assert probe.status_code == 200, probe.text
        assert probe.json()["checks"]["storage"] == "ok"
    listed = bucket.list_objects_v2(Bucket=s3_bucket)
    assert [o["Key"] for o in listed.get("Contents", [])] == []  # the probe deleted its object


def _wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
