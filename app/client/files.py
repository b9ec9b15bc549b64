"""`overnight files list|rm`."""

import argparse

from app.client import output
from app.client.connection import client


def cmd_list(args: argparse.Namespace) -> int:
    kwargs = {"purpose": args.purpose} if args.purpose else {}
    files = client(args).files.list(limit=args.limit, **kwargs).data
    return output.print_listing(
        args.json,
        files,
        ["ID", "FILENAME", "PURPOSE", "BYTES", "CREATED"],
        ((f.id, f.filename, f.purpose, f.bytes, output.age(f.created_at)) for f in files),
        empty="No files.",
    )


def cmd_rm(args: argparse.Namespace) -> int:
    api = client(args)
    for file_id in args.file_ids:
        deleted = api.files.delete(file_id)
        print(f"{deleted.id} deleted")
    return 0
