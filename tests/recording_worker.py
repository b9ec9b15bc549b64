"""`python -m tests.recording_worker --submission-log FILE --finished-log DONE ARGS...`:
`overnight worker ARGS...`, each request it sends to its engine recorded in FILE and each
answer it gets back in DONE (`tests.submission_log`)."""

import argparse
import sys

from tests.submission_log import record_submissions
from worker.cli import main as worker_main


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--submission-log", required=True)
    parser.add_argument("--finished-log", required=True)
    args, rest = parser.parse_known_args(argv)
    record_submissions(args.submission_log, args.finished_log)
    return worker_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
