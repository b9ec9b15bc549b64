"""Writes openapi/openapi.json from the app: `.venv/bin/python openapi/generate.py`.

`--check` exits 1 if the committed file differs from what the code produces.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.config import Settings
from app.main import create_app

TARGET = Path(__file__).resolve().parent / "openapi.json"


def document() -> dict[str, Any]:
    """The app's OpenAPI document; independent of the machine's settings and data."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), _env_file=None)  # type: ignore[call-arg]
        return create_app(settings).openapi()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run `python openapi/generate.py`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
