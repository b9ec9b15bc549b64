"""Sizes in messages: decimal units as the `max_*_bytes` settings use, and the setting's name."""

from app.config import Settings
from app.core.sizes import SizeLimit, human_bytes, too_large_message


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 999, 1000, 1500, 65_536, 200_000_000, 8 * 10**9)] == [
        "0 bytes",
        "999 bytes",
        "1 kB",
        "1.5 kB",
        "65.5 kB",
        "200 MB",
        "8 GB",
    ]
    assert human_bytes(3 * 10**15) == "3000 TB"


def test_a_refusal_names_the_size_the_limit_and_its_setting() -> None:
    settings = Settings(max_file_bytes=200_000_000, _env_file=None)  # type: ignore[call-arg]
    limit = settings.size_limit("max_file_bytes")
    assert limit == SizeLimit(200_000_000, "OVERNIGHT_MAX_FILE_BYTES")
    assert too_large_message("The file", limit, 210_000_000) == (
        "The file is 210 MB; the limit is 200 MB (OVERNIGHT_MAX_FILE_BYTES)."
    )
    assert too_large_message("The file", limit) == (
        "The file is larger than the limit of 200 MB (OVERNIGHT_MAX_FILE_BYTES)."
    )
    # Sizes that would read the same are given exactly.
    assert too_large_message("The file", limit, 200_000_001) == (
        "The file is 200,000,001 bytes; the limit is 200,000,000 bytes (OVERNIGHT_MAX_FILE_BYTES)."
    )
