"""The `overnight` command: run the service, manage the database and API keys.

`--version` and every `--help` answer without importing the service: each command imports
what it needs when it runs (`tests/test_cli_speed.py` holds it to that).
"""

import argparse
import ipaddress
import logging
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from app.client import register as register_client_commands
from app.offline.arguments import add_arguments as add_run_batch_arguments
from app.version import __version__

if TYPE_CHECKING:
    from app.config import Settings
    from app.services.auth import Access

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

Command = Callable[[argparse.Namespace], int]

RUN_BATCH_VLLM_HELP = (
    "Every other argument goes to vLLM, as with vLLM's run_batch (--max-model-len, --dtype, "
    "--tensor-parallel-size, ...): `overnight run-batch --help=all` lists vLLM's engine "
    "arguments, --help=<group> shows one group (e.g. --help=ModelConfig), --help=<word> "
    "searches them."
)


SERVE_WORKER_HELP = (
    "Every other argument goes to each worker, as `overnight worker` takes it: worker options "
    "and vLLM's engine arguments (--enforce-eager, --max-model-len, --max-num-seqs, ...)."
)


def _settings(args: argparse.Namespace) -> "Settings":
    from app.config import get_settings

    overrides = {
        key: value
        for key in ("host", "port", "data_dir")
        if (value := getattr(args, key, None)) is not None
    }
    # model_copy does not validate: the flag's string must become the field's Path.
    if "data_dir" in overrides:
        overrides["data_dir"] = Path(overrides["data_dir"])
    return get_settings().model_copy(update=overrides)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def check_bind_safety(settings: "Settings") -> "Access":
    """Decides open mode for this start; without API keys only loopback is allowed."""
    from app.db.session import session_scope
    from app.services.auth import Access

    with session_scope(settings) as session:
        access = Access.at_startup(session, settings)
    if access.started_open and not _is_loopback(settings.host):
        raise SystemExit(
            f"Refusing to listen on {settings.host} without API keys: anyone could use it. "
            "Set OVERNIGHT_ADMIN_KEY or run `overnight keys create --project NAME` first."
        )
    return access


def access_line(access: "Access") -> str:
    if access.started_open:
        return (
            "No API keys are configured: the API is open, so it listens on loopback only "
            "(creating a key closes it for good)."
        )
    return "API keys are required (decided at start-up: revoking keys never opens the API)."


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from app.db.session import upgrade
    from app.http_server import server_options
    from app.logging import configure_logging
    from app.main import create_app

    settings = _settings(args)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.sqlalchemy_url)
    configure_logging(settings.log_level, settings.log_format)
    log = logging.getLogger("overnight.api")
    access = check_bind_safety(settings)
    log.log(logging.WARNING if access.started_open else logging.INFO, "%s", access_line(access))
    log.info("API on http://%s:%d/v1", settings.host, settings.port)
    uvicorn.run(
        create_app(settings, access),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        **server_options(settings),
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.core.redaction import masked_url
    from app.db.session import upgrade

    settings = _settings(args)
    upgrade(settings.sqlalchemy_url)
    print(f"database at the newest schema: {masked_url(settings.sqlalchemy_url)}")
    return 0


def cmd_run_batch(args: argparse.Namespace) -> int:
    from app.offline.runner import main as run_batch

    return run_batch(args, args.extra)


def cmd_serve(args: argparse.Namespace) -> int:
    from app.db.session import upgrade
    from app.logging import configure_logging
    from app.supervisor import serve

    settings = _settings(args)
    engine_args = list(args.extra)
    if engine_args:  # checked before anything starts; vLLM is imported only for this
        from worker.cli import check_shared_arguments

        check_shared_arguments(engine_args, prog="overnight serve")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.sqlalchemy_url)
    # Raises on an unsafe bind; the API child logs the access line, once.
    access = check_bind_safety(settings)
    served = [m.name for m in settings.models]
    models = [] if args.no_workers else (args.models.split(",") if args.models else served)
    if unknown := [m for m in models if m not in served]:
        raise SystemExit(f"overnight: not a served model: {', '.join(unknown)} (served: {served})")
    configure_logging(settings.log_level, settings.log_format)
    online = args.online_port if args.online else None
    return serve(settings, models, access.started_open, online, engine_args)


def _listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        help="the address to listen on (default: OVERNIGHT_HOST, 127.0.0.1); "
        "anything but loopback needs API keys",
    )
    parser.add_argument("--port", type=int, help="the port (default: OVERNIGHT_PORT, 8000)")


def _local_command(
    sub: "Subparsers", name: str, help: str, func: Command
) -> argparse.ArgumentParser:
    """A command that runs on this host's data: `--data-dir` names it."""
    parser = sub.add_parser(name, help=help)
    parser.add_argument(
        "--data-dir", dest="data_dir", help="where the SQLite file and stored files live"
    )
    parser.set_defaults(func=func)
    return parser


def _group(sub: "Subparsers", name: str, help: str) -> "Subparsers":
    return sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", required=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="overnight", description=__doc__)
    parser.add_argument("--version", action="version", version=f"overnight {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _local_command(sub, "serve", "run the API and one worker per served model", cmd_serve)
    p.usage = "overnight serve [options] [worker and vLLM engine arguments]"
    p.allow_abbrev = False  # `--model` must reach the check, not be taken for `--models`
    p.epilog = SERVE_WORKER_HELP
    _listen(p)
    p.add_argument("--models", help="comma-separated served models to start workers for")
    p.add_argument("--no-workers", action="store_true", help="the API only, workers run elsewhere")
    p.add_argument(
        "--online",
        action="store_true",
        help="each worker also serves vLLM's OpenAI API for its model, on its own port "
        "(--online-port, then the next ones), with the same API keys; batches give way to it",
    )
    p.add_argument(
        "--online-port",
        type=int,
        default=8001,
        help="the first worker's online port with --online (default: 8001)",
    )
    _listen(_local_command(sub, "api", "run the HTTP API only", cmd_api))
    db = _group(sub, "db", "database schema")
    _local_command(db, "upgrade", "apply every migration", cmd_db_upgrade)

    register_client_commands(sub)  # batches, files, keys
    p = sub.add_parser(
        "run-batch",
        help="run one batch file offline, like vLLM's run_batch (vLLM arguments pass through)",
        description="Run one batch file offline, as vLLM's run_batch does, checkpointed: rerun "
        "the same command after a crash and it resumes.",
        epilog=RUN_BATCH_VLLM_HELP,
    )
    add_run_batch_arguments(p)
    p.set_defaults(func=cmd_run_batch)
    # Everything after `worker` goes to worker.cli: its own options, then vLLM's parser.
    p = sub.add_parser(
        "worker", help="run batch requests on an embedded vLLM engine", add_help=False
    )
    p.set_defaults(func=cmd_worker)
    models = _group(sub, "models", "bundled models")
    prepare = "convert the bundled chat model once, ahead of time"
    _local_command(models, "prepare", prepare, cmd_models_prepare)
    return parser


def cmd_worker(args: argparse.Namespace) -> int:
    from worker.cli import main as worker_main

    return worker_main(args.extra)


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from worker.models import ensure_converted

    print(ensure_converted(_settings(args).data_dir))
    return 0


def _print_vllm_help(command: str, argv: Sequence[str]) -> None:
    """`overnight run-batch --help=all|<group>|<word>`: vLLM's engine arguments, as vLLM
    shows them (imports vLLM: seconds); exits."""
    from worker.cli import vllm_parser

    parser = vllm_parser()
    parser.prog = f"overnight {command}"
    parser.parse_args([arg for arg in argv if arg.startswith("--help=")])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run-batch"] and any(arg.startswith("--help=") for arg in argv):
        _print_vllm_help("run-batch", argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("worker", "run-batch", "serve"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    result: int = args.func(args)
    return result


def run() -> NoReturn:
    """The `overnight` command: `main`, then the process's end without the interpreter's
    teardown (after vLLM's imports, 2 s of every `run-batch` and worker stop)."""
    code = main()
    from worker.process import end_process

    end_process(code)


if __name__ == "__main__":
    run()
