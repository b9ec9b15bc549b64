"""What the dashboard shows, as flat dicts of display values.

Templates render them on the first load and the page script fills the same keys
from the JSON feeds afterwards, so both paths show identical text. Values are
plain data: Jinja escapes them and the script only ever sets `textContent`.
This module holds what every page shares; each page's rows are in `batch_views`,
`worker_views`, `project_views` and `charts`.
"""

from datetime import UTC, datetime
from typing import Any

Row = dict[str, Any]
DASH = "—"


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return DASH
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, whole = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {whole:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def file_href(file_id: str | None) -> str:
    return f"/dashboard/files/{file_id}/content" if file_id else ""
