"""Validation and finalization latency while slow webhook receivers are hit, against none.

Starts `overnight api` (bench/server.py) and runs rounds of one batch each, alternating
two phases (which goes first alternates too):

- `quiet`: no receiver at all;
- `hostile`: `--receivers` loopback receivers that answer with a status line and then one
  byte every 0.5 s (tests/webhook_receiver.py), each with an endpoint subscribed to every
  batch event, hit by test events from `--tests-per-receiver` clients each, one after
  another, all round long (and sent every batch's events). Two clients each keep every
  endpoint's two slots taken: 16 test events at once.

A round creates a batch of `--lines` requests through the API and times
  validation    the create request → `in_progress` (the create route wakes validation),
  finalization  its last shard done → `completed`.
Shards are run by the test suite's stand-in worker (tests/batch_sim.py) in this process, so
no worker process finalizes: the API's housekeeping does, as it does for any batch a worker
leaves. Prints each phase's medians and hostile/quiet; target: within 10 %.

`--root DIR` runs the API of another checkout (e.g. `git archive HEAD | tar -x -C DIR`), to
compare with a version before a change; a round that is still waiting after `--patience`
seconds counts as that long.

    .venv/bin/python bench/bench_webhooks.py [--receivers 8] [--tests-per-receiver 2]
        [--rounds 9] [--lines 50000] [--backend sqlite|postgresql] [--root DIR] [--patience 120]
"""

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server import ROOT, api_server

from app.config import Settings
from tests import batch_sim as sim
from tests.harness import fresh_database
from tests.webhook_receiver import DRIP, stalling_receiver

EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
DEADLINE_SECONDS = 5.0  # the default OVERNIGHT_WEBHOOK_TIMEOUT_SECONDS
POLL_SECONDS = 0.005
CHUNK_LINES = 1000


@dataclass(frozen=True)
class Latency:
    validation: float
    finalization: float


class Hostility:
    """Endpoints of dripping receivers, and the clients that send them test events."""

    def __init__(self, api: str, urls: list[str], clients_each: int) -> None:
        self.api = api
        self.endpoints = [_create_endpoint(api, url) for url in urls]
        self.clients_each = clients_each

    @contextmanager
    def on(self) -> Iterator[None]:
        """Endpoints enabled and test events flowing, until the block ends."""
        self._enable(True)
        stop = threading.Event()
        threads = [
            threading.Thread(target=self._send_tests, args=(endpoint, stop), daemon=True)
            for endpoint in self.endpoints
            for _ in range(self.clients_each)
        ]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            self._enable(False)
            time.sleep(DEADLINE_SECONDS + 1)  # the deliveries under way end

    def _send_tests(self, endpoint: str, stop: threading.Event) -> None:
        url = f"{self.api}/v1/webhook_endpoints/{endpoint}/test"
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                with suppress(httpx.HTTPError):  # a stalled API (before the fix)
                    http.post(url, json={"event_type": "batch.completed"})

    def _enable(self, enabled: bool) -> None:
        for endpoint in self.endpoints:
            url = f"{self.api}/v1/webhook_endpoints/{endpoint}"
            httpx.post(url, json={"enabled": enabled}, timeout=60).raise_for_status()


def _create_endpoint(api: str, url: str) -> str:
    body = {"name": "slow", "url": url, "event_types": EVENTS, "enabled": False}
    created = httpx.post(f"{api}/v1/webhook_endpoints", json=body, timeout=60)
    created.raise_for_status()
    endpoint_id: str = created.json()["id"]
    return endpoint_id


def run_round(settings: Settings, api: str, data: bytes, patience: float) -> Latency:
    """One batch: created through the API, its shards run here, finalized by the API."""
    file_id = sim.store_input_file(settings, data)
    body = {"input_file_id": file_id, "endpoint": sim.CHAT, "completion_window": "24h"}
    start = time.monotonic()
    created = httpx.post(f"{api}/v1/batches", json=body, timeout=patience)
    created.raise_for_status()
    batch_id = created.json()["id"]
    validated = _wait(settings, batch_id, "in_progress", start + patience)
    while (claim := sim.claim_shard(settings, "bench-worker", batch_id)) is not None:
        sim.run_shard(settings, claim, chunk_lines=CHUNK_LINES)
    shards_done = time.monotonic()
    completed = _wait(settings, batch_id, "completed", shards_done + patience)
    return Latency(validated - start, completed - shards_done)


def _wait(settings: Settings, batch_id: str, status: str, give_up_at: float) -> float:
    """When the batch was first seen in `status` (or `give_up_at`)."""
    while sim.load_batch(settings, batch_id).status != status:
        if time.monotonic() >= give_up_at:
            return give_up_at
        time.sleep(POLL_SECONDS)
    return time.monotonic()


def run(args: argparse.Namespace, settings: Settings) -> dict[str, list[Latency]]:
    env = {
        "OVERNIGHT_DATA_DIR": str(settings.data_dir),
        "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url,
        "OVERNIGHT_WEBHOOK_ALLOW_PRIVATE": "1",
        "OVERNIGHT_WEBHOOK_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
        "OVERNIGHT_HOUSEKEEPING_INTERVAL_SECONDS": "0.1",
        "OVERNIGHT_LOG_LEVEL": "warning",
    }
    data = sim.requests_file(args.lines)
    results: dict[str, list[Latency]] = {"quiet": [], "hostile": []}
    with ExitStack() as stack:
        server = stack.enter_context(api_server(env, root=args.root))
        receivers = [stack.enter_context(stalling_receiver(DRIP)) for _ in range(args.receivers)]
        hostility = Hostility(server.url, [r.url for r in receivers], args.tests_per_receiver)
        run_round(settings, server.url, data, args.patience)  # warm-up, not counted
        for round_no in range(args.rounds):
            phases = ["quiet", "hostile"] if round_no % 2 == 0 else ["hostile", "quiet"]
            for phase in phases:
                with hostility.on() if phase == "hostile" else nullcontext():
                    if phase == "hostile":
                        receivers[0].wait_for(receivers[0].requests + 1)  # under way
                    results[phase].append(run_round(settings, server.url, data, args.patience))
        print(f"the receivers got {sum(r.requests for r in receivers)} requests")
    return results


def report(results: dict[str, list[Latency]]) -> None:
    print(f"{'phase':<10}{'validation s':>14}{'finalization s':>16}   (medians; every round)")
    medians = {}
    for phase, rounds in results.items():
        medians[phase] = Latency(
            statistics.median(r.validation for r in rounds),
            statistics.median(r.finalization for r in rounds),
        )
        every = ", ".join(f"{r.validation:.2f}/{r.finalization:.2f}" for r in rounds)
        print(
            f"{phase:<10}{medians[phase].validation:>14.3f}"
            f"{medians[phase].finalization:>16.3f}   {every}"
        )
    quiet, hostile = medians["quiet"], medians["hostile"]
    print(
        f"{'hostile/quiet':<10}{hostile.validation / quiet.validation:>14.2f}"
        f"{hostile.finalization / quiet.finalization:>16.2f}"
    )
    print("target: hostile/quiet <= 1.10")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--receivers", type=int, default=8)
    parser.add_argument("--tests-per-receiver", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose API runs")
    parser.add_argument("--patience", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fresh_database(args.backend, Path(tmp)) as url:
        settings = Settings(data_dir=Path(tmp), database_url=url, _env_file=None)  # type: ignore[call-arg]
        print(
            f"{args.backend}: {args.rounds} rounds of a {args.lines:,}-line batch; hostile: "
            f"{args.receivers} dripping receivers, {args.tests_per_receiver} clients each"
        )
        report(run(args, settings))


if __name__ == "__main__":
    main()
