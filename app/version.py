"""The running build's version: the installed package's, as `pip show overnight` has it."""

from importlib.metadata import PackageNotFoundError, version


def overnight_version() -> str:
    try:
        return version("overnight")
    except PackageNotFoundError:  # a source tree on PYTHONPATH that was never installed
        return "unknown (not installed)"
