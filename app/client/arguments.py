"""What the people's subcommands parse: connection flags, limit values, quota options.

Imported for every `overnight ... --help`, so it imports nothing heavier than the standard
library and `app.core.states`.
"""

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from app.core.states import ALL_WEBHOOK_EVENTS

Command = Callable[[argparse.Namespace], int]

# Any: the SDK types event names as a Literal of every OpenAI event, ours are four of them.
ALL_EVENTS: list[Any] = ALL_WEBHOOK_EVENTS
# A limit or quota given as `default` goes back to the deployment's.
DEFAULT = "default"
# Each quota: its field in the admin API's answer (`--stored-bytes` sets `stored_bytes`), its unit.
QUOTAS = (
    ("stored_bytes", "bytes"),
    ("files", "files"),
    ("open_uploads", "open uploads"),
    ("unfinished_batches", "unfinished batches"),
)


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--base-url",
        help="the API, e.g. http://host:8000/v1 (default: $OPENAI_BASE_URL, else this "
        "machine's OVERNIGHT_HOST:OVERNIGHT_PORT)",
    )
    group.add_argument("--api-key", help="an API key (default: $OPENAI_API_KEY)")


def limit_value(text: str) -> int | None:
    """A limit on the command line: a count (`2000000`, `2_000_000`), or `default`: None."""
    if text == DEFAULT:
        return None
    value = int(text.replace(",", ""))
    if value < 0:
        raise ValueError(text)
    return value


def quota_option(field: str) -> str:
    return "--" + field.replace("_", "-")


class Deferred:
    """A command `function` of the module `app.client.<module>`, imported when it runs: the
    SDK, rich and the database layer cost seconds that `--help` should not pay."""

    def __init__(self, module: str, function: str) -> None:
        self.module = module
        self.function = function

    def resolve(self) -> Command:
        module = importlib.import_module(f"app.client.{self.module}")
        command: Command = getattr(module, self.function)
        return command

    def __call__(self, args: argparse.Namespace) -> int:
        from app.client.connection import reports_errors

        return reports_errors(self.resolve())(args)
