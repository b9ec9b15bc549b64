"""overnight's version, in this one place: the package metadata (pyproject.toml's dynamic
`version`), `overnight --version`, the API's OpenAPI document, the dashboard, the banner and
`/metrics` all read it, and CHANGELOG.md's newest release names it."""

__version__ = "0.1.0"


def overnight_version() -> str:
    return __version__
