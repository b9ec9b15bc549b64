"""Sizes for people: bytes in decimal units (as `max_*_bytes` settings are), and refusals
that name the setting a user would change."""

from dataclasses import dataclass

_UNITS = ("kB", "MB", "GB", "TB")


def human_bytes(size: int) -> str:
    """`999 bytes`, `1.5 kB`, `200 MB`: one decimal at most, none when it is zero."""
    if abs(size) < 1000:
        return f"{size} bytes"
    value = float(size)
    for unit in _UNITS:
        value /= 1000
        if abs(value) < 1000 or unit == _UNITS[-1]:
            break
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


@dataclass(frozen=True)
class SizeLimit:
    """A size limit and the environment variable that sets it."""

    bytes: int
    setting: str  # e.g. OVERNIGHT_MAX_FILE_BYTES


def too_large_message(what: str, limit: SizeLimit, size: int | None = None) -> str:
    """`The file is 210 MB; the limit is 200 MB (OVERNIGHT_MAX_FILE_BYTES).`

    `size` None is for a stream cut off as it passed the limit: its size is not known.
    """
    allowed = human_bytes(limit.bytes)
    if size is None:
        return f"{what} is larger than the limit of {allowed} ({limit.setting})."
    shown = human_bytes(size)
    if shown == allowed:  # 200.04 MB against 200 MB: say which is larger
        shown, allowed = f"{size:,} bytes", f"{limit.bytes:,} bytes"
    return f"{what} is {shown}; the limit is {allowed} ({limit.setting})."
