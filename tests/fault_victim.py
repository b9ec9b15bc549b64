"""`python -m tests.fault_victim`: a process that runs a write path until the armed point
stops it (`os._exit(FAULT_EXIT)`); exit 0 if the point was never reached."""

import argparse
import asyncio
import logging
import sys
from pathlib import Path as FsPath

from tests.fault_api import api, send_through_faults
from tests.fault_pipeline import Deployment, drive, fault_settings
from tests.fault_points import POINTS_BY_NAME, Action, Injector, Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fault_victim")
    parser.add_argument("--data-dir", required=True, type=FsPath)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--point", required=True, choices=sorted(POINTS_BY_NAME))
    parser.add_argument("--batch-id")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    deployment = Deployment(fault_settings(args.data_dir, args.database_url))
    point = POINTS_BY_NAME[args.point]
    injector = deployment.arm(Injector(point, Action.EXIT))
    storage = deployment.storage(injector)
    if point.site.path is Path.BATCH:
        asyncio.run(drive(deployment, storage, args.batch_id, timeout=60))
    else:
        with api(deployment.settings, storage) as client:
            send_through_faults(client, point.site.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
