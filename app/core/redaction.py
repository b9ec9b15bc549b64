"""URLs as they may be printed or logged: never with their password."""

import re

HIDDEN = "***"
# `scheme://user:password@`, in text that is no URL SQLAlchemy can parse.
_USER_INFO = re.compile(r"(//[^/@:]*:)[^/@]*@")


def masked_url(url: str) -> str:
    """`url` with its password (in the user info or a `password` query parameter) as `***`."""
    # Imported here: the settings check S3 URLs with this module, and the CLI's commands over
    # HTTP read the settings without needing SQLAlchemy (a quarter of their start).
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return _USER_INFO.sub(rf"\g<1>{HIDDEN}@", url)
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": HIDDEN})
    return parsed.render_as_string(hide_password=True)
