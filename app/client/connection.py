"""Which deployment the CLI talks to, and how API errors become one clear line."""

import argparse
import os
import sys
from functools import wraps
from typing import TYPE_CHECKING, Any

from app.client.arguments import Command
from app.config import get_settings
from app.errors import OpenAIError as ServiceError

if TYPE_CHECKING:  # the SDK takes a second to import: commands on this machine never need it
    import openai


class CliError(Exception):
    """A failure to report as one line on stderr, with a non-zero exit."""


def explicit_base_url(args: argparse.Namespace) -> str | None:
    """A base URL given by flag or environment; None means "this machine"."""
    return getattr(args, "base_url", None) or os.environ.get("OPENAI_BASE_URL") or None


def base_url(args: argparse.Namespace) -> str:
    if url := explicit_base_url(args):
        return url
    settings = get_settings()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return f"http://{host}:{settings.port}/v1"


def api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("OPENAI_API_KEY") or None


def client(args: argparse.Namespace) -> "openai.OpenAI":
    import openai

    # Without keys the server accepts any token, but the SDK insists on one.
    key = api_key(args) or "none"
    return openai.OpenAI(base_url=base_url(args), api_key=key, max_retries=2, timeout=120)


def _status_message(exc: "openai.APIStatusError", args: argparse.Namespace) -> str:
    body: Any = exc.body
    message = (body.get("message") if isinstance(body, dict) else None) or exc.message
    # Without a key the SDK sent a stand-in: what the server says of it helps nobody.
    if exc.status_code == 401 and api_key(args) is None:
        return "this deployment needs an API key: pass --api-key or set OPENAI_API_KEY"
    url = base_url(args).rstrip("/")
    if exc.status_code == 404 and not url.endswith("/v1"):
        return f"{message}; is /v1 missing from the base URL? (e.g. {url}/v1)"
    return str(message)


def describe(exc: BaseException, args: argparse.Namespace) -> str:
    """One line a person can act on, from whatever went wrong."""
    if isinstance(exc, ServiceError):
        return exc.message
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    if isinstance(exc, _sdk_errors()):
        return _describe_sdk_error(exc, args)
    return str(exc)


def _describe_sdk_error(exc: BaseException, args: argparse.Namespace) -> str:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return f"{_status_message(exc, args)} (HTTP {exc.status_code})"
    if isinstance(exc, openai.APITimeoutError):
        return f"{base_url(args)} did not answer in time."
    if isinstance(exc, openai.APIConnectionError):
        return (
            f"cannot reach {base_url(args)}: is `overnight serve` running there? "
            "(set --base-url or OPENAI_BASE_URL)"
        )
    return str(exc)


def _sdk_errors() -> tuple[type[Exception], ...]:
    """The SDK's errors, where the command imported the SDK (only then can it raise them)."""
    sdk = sys.modules.get("openai")
    return (sdk.OpenAIError,) if sdk is not None else ()


def _reported_errors() -> tuple[type[Exception], ...]:
    return (CliError, ServiceError, OSError, *_sdk_errors())


def reports_errors(command: Command) -> Command:
    """Runs a command; any API, network or file error ends it with a message, not a trace."""

    @wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except _reported_errors() as exc:
            print(f"overnight: error: {describe(exc, args)}", file=sys.stderr)
            return 1

    return run
