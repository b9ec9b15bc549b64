"""The in-flight window on its own, with a scripted engine: bounds, grouping, dedup, abort."""

import asyncio
from typing import Any

import pytest

from app.endpoints import CHAT, EMBEDDINGS, RESPONSES
from tests.fake_engine import FakeEngine
from worker.engine_results import EngineResult
from worker.scheduler import Job, Scheduler, dedup_key, prefix_key


class Collector:
    def __init__(self) -> None:
        self.results: list[tuple[Job, EngineResult, bool]] = []
        self.failures: list[BaseException] = []

    def deliver(self, job: Job, result: EngineResult, copied: bool) -> None:
        self.results.append((job, result, copied))

    def engine_failed(self, error: BaseException) -> None:
        self.failures.append(error)

    async def leased(self) -> bool:
        return True


def chat(content: str, system: str = "", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    return {"messages": [*messages, {"role": "user", "content": content}], **extra}


def job(sink: Collector, line: int, body: dict[str, Any], batch: str = "b1") -> Job:
    return Job(sink, batch, CHAT, line, f"c{line}", body)


async def drain(scheduler: Scheduler, sink: Collector, n: int) -> None:
    while len(sink.results) < n:
        await asyncio.sleep(0.005)


def test_window_bounds_requests_in_flight() -> None:
    async def scenario() -> tuple[int, int]:
        engine = FakeEngine(delay=0.01)
        scheduler = Scheduler(engine, window=3, lookahead=2)
        sink = Collector()
        for i in range(20):
            await scheduler.submit(job(sink, i, chat(f"q{i}")))
            # Every task but this one runs a request; the rest of the unanswered ones wait.
            in_flight = len(asyncio.all_tasks()) - 1
            waiting = i + 1 - len(sink.results) - in_flight
            assert waiting <= 2 and in_flight <= 3
        await drain(scheduler, sink, 20)
        return engine.peak, len(engine.calls)

    peak, calls = asyncio.run(scenario())
    assert peak == 3 and calls == 20


def test_shared_prefixes_run_together() -> None:
    async def scenario() -> list[str]:
        engine = FakeEngine(delay=0.01)
        scheduler = Scheduler(engine, window=1, lookahead=100)
        sink = Collector()
        # Keep the engine busy so the pool fills before anything is picked.
        await scheduler.submit(job(sink, 0, chat("warm-up", delay=0.05)))
        for i in range(1, 9):
            system = "You answer about maths. " * 20 if i % 2 else "You answer about history. " * 20
            await scheduler.submit(job(sink, i, chat(f"q{i}", system)))
        await drain(scheduler, sink, 9)
        return [body["messages"][-1]["content"] for body in engine.bodies()]

    order = asyncio.run(scenario())
    assert order == ["warm-up", "q1", "q3", "q5", "q7", "q2", "q4", "q6", "q8"]


def test_responses_prefixes_and_malformed_inputs() -> None:
    text = prefix_key(RESPONSES, {"instructions": "Be brief.", "input": "Hi"})
    items = prefix_key(
        RESPONSES, {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}]}
    )
    assert text == items == "system:Be brief.\nuser:Hi"
    # Lines the engine will refuse must not break the scheduler before they get there.
    for bad in (5, {"role": "user"}, None, True):
        assert prefix_key(RESPONSES, {"input": bad}) == ""


def test_requests_without_a_prefix_run_after_prefixed_ones() -> None:
    """A line no prefix is computed for (an unknown url, a /v1/messages line) waits in the
    group keyed None: it runs like any other, never taken for "no group may run"."""

    async def scenario() -> list[int]:
        engine = FakeEngine(delay=0.01)
        scheduler = Scheduler(engine, window=1, lookahead=100)
        sink = Collector()
        await scheduler.submit(job(sink, 0, chat("warm-up", delay=0.05)))
        await scheduler.submit(job(sink, 1, chat("q1", "A" * 300)))
        await scheduler.submit(Job(sink, "b1", "/bad_url", 2, "c2", chat("q2")))
        await scheduler.submit(job(sink, 3, chat("q3", "A" * 300)))
        await asyncio.wait_for(drain(scheduler, sink, 4), 10)
        return sorted(j.line for j, _, _ in sink.results)

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_grouping_off_keeps_input_order() -> None:
    async def scenario() -> list[str]:
        engine = FakeEngine(delay=0.01)
        scheduler = Scheduler(engine, window=1, lookahead=100, prefix_grouping=False)
        sink = Collector()
        for i in range(6):
            await scheduler.submit(job(sink, i, chat(f"q{i}", "A" * 300 if i % 2 else "B" * 300)))
        await drain(scheduler, sink, 6)
        return [body["messages"][-1]["content"] for body in engine.bodies()]

    assert asyncio.run(scenario()) == [f"q{i}" for i in range(6)]


def test_identical_deterministic_requests_run_once() -> None:
    async def scenario() -> tuple[FakeEngine, Collector]:
        engine = FakeEngine(delay=0.02)
        scheduler = Scheduler(engine, window=4)
        sink = Collector()
        for i in range(3):
            await scheduler.submit(job(sink, i, chat("same", temperature=0)))
        await scheduler.submit(job(sink, 3, chat("same")))  # sampled: runs on its own
        await scheduler.submit(job(sink, 4, chat("same", temperature=0), batch="b2"))
        await drain(scheduler, sink, 5)
        await scheduler.submit(job(sink, 5, chat("same", temperature=0)))  # from the cache
        return engine, sink

    engine, sink = asyncio.run(scenario())
    assert len(engine.calls) == 3
    copied = sorted(j.line for j, _, was_copied in sink.results if was_copied)
    assert copied == [1, 2, 5]


def test_dedup_keys() -> None:
    assert dedup_key("b", CHAT, chat("x")) is None
    assert dedup_key("b", CHAT, chat("x", temperature=0.7)) is None
    assert dedup_key("b", CHAT, chat("x", temperature=0.7, seed=1)) is not None
    assert dedup_key("b", CHAT, {"temperature": 0, "a": 1, "b": 2}) == dedup_key(
        "b", CHAT, {"b": 2, "a": 1, "temperature": 0}
    )
    assert dedup_key("b", EMBEDDINGS, {"input": "x"}) is not None
    assert prefix_key(CHAT, chat("one", "S" * 300)) == prefix_key(CHAT, chat("two", "S" * 300))
    assert prefix_key(EMBEDDINGS, {"input": "x"}) is None


def test_abort_drops_waiting_and_aborts_running() -> None:
    async def scenario() -> tuple[FakeEngine, Collector, Collector, int]:
        engine = FakeEngine(delay=5)
        scheduler = Scheduler(engine, window=2, lookahead=10)
        doomed, other = Collector(), Collector()
        for i in range(4):
            await scheduler.submit(job(doomed, i, chat(f"d{i}")))
        # A follower from another sink waits on one of the doomed sink's waiting jobs.
        await scheduler.submit(job(doomed, 10, chat("shared", temperature=0, delay=0.01)))
        await scheduler.submit(job(other, 11, chat("shared", temperature=0, delay=0.01)))
        await asyncio.sleep(0.05)
        dropped = await scheduler.abort(doomed)
        await drain(scheduler, other, 1)
        return engine, doomed, other, dropped

    engine, doomed, other, dropped = asyncio.run(scenario())
    assert len(engine.aborted) == 2
    assert dropped == 5
    assert doomed.results == []
    [(survivor, _, copied)] = other.results
    assert survivor.line == 11 and not copied


class LapsedSink(Collector):
    """A shard run whose lease may have lapsed: its jobs wait, then the run ends (lost)."""

    def __init__(self) -> None:
        super().__init__()
        self.over = asyncio.Event()

    async def leased(self) -> bool:
        await self.over.wait()
        return False


def test_a_run_that_ended_while_its_jobs_waited_sends_none_of_them() -> None:
    """A worker frozen past its lease wakes, and its shard turns out taken over: the lines
    that waited for a renewal, and those its feeder hands over after the loss, never reach
    the engine (the new holder may have persisted them); a follower from another sink still
    gets its answer."""

    async def scenario() -> tuple[FakeEngine, LapsedSink, Collector]:
        engine = FakeEngine(delay=0.01)
        scheduler = Scheduler(engine, window=2, lookahead=10)
        lapsed, other = LapsedSink(), Collector()
        for i in range(3):
            await scheduler.submit(job(lapsed, i, chat(f"l{i}")))
        await scheduler.submit(job(lapsed, 10, chat("shared", temperature=0)))
        await scheduler.submit(job(other, 11, chat("shared", temperature=0)))
        await asyncio.sleep(0.05)
        assert engine.calls == []  # all wait for the lease
        lapsed.over.set()
        await scheduler.submit(job(lapsed, 5, chat("l5")))  # the feeder, after the loss
        await drain(scheduler, other, 1)
        await asyncio.sleep(0.05)
        return engine, lapsed, other

    engine, lapsed, other = asyncio.run(scenario())
    assert [body["messages"][-1]["content"] for body in engine.bodies()] == ["shared"]
    assert lapsed.results == []
    [(survivor, _, copied)] = other.results
    assert survivor.line == 11 and not copied


def test_engine_failure_reaches_every_sink() -> None:
    class Broken(FakeEngine):
        async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
            raise RuntimeError("engine died")

    async def scenario() -> Collector:
        scheduler = Scheduler(Broken(), window=2)
        sink = Collector()
        await scheduler.submit(job(sink, 1, chat("x")))
        await asyncio.sleep(0.05)
        return sink

    sink = asyncio.run(scenario())
    assert sink.failures and sink.results == []


def test_preempted_requests_run_again_once_each() -> None:
    async def scenario() -> tuple[FakeEngine, Collector, int, int]:
        engine = FakeEngine(delay=0.2)
        scheduler = Scheduler(engine, window=6, lookahead=20)
        sink = Collector()
        for i in range(12):
            await scheduler.submit(job(sink, i, chat(f"q{i}", temperature=0)))
        await asyncio.sleep(0.05)
        preempted = await scheduler.resize(2)
        in_flight = engine.running
        await asyncio.sleep(0.05)
        await scheduler.resize(6)
        await drain(scheduler, sink, 12)
        await asyncio.sleep(0.3)  # nothing more may arrive
        return engine, sink, preempted, in_flight

    engine, sink, preempted, in_flight = asyncio.run(scenario())
    assert preempted == 4 and in_flight == 2
    assert sorted(j.line for j, _, _ in sink.results) == list(range(12))
    # The newest four were aborted in the engine, then sent again under new request ids.
    assert len(engine.aborted) == 4 and len(engine.calls) == 16
    again = [rid for _, _, rid in engine.calls[6:10]]
    assert not set(again) & set(engine.aborted)
    assert {j.line for j, _, _ in sink.results[:2]} == {0, 1}


def test_the_batch_window_grows_back_in_steps_after_a_quiet_spell() -> None:
    from worker.backoff import MAX_QUIET_SECONDS, BackoffPolicy, next_change, target_window

    policy = BackoffPolicy(busy_window=2, quiet_seconds=0.1, quiet_gaps=5, regrow_seconds=0.5)
    assert target_window(policy, 64, active=1, quiet_for=99) == 2
    assert target_window(policy, 64, active=0, quiet_for=0.05) == 2
    # never two arrivals yet: the hold is quiet_seconds, then one doubling per regrow_seconds
    assert [target_window(policy, 64, 0, 0.1 + t) for t in (0, 0.5, 1.0, 1.5, 2.0, 9)] == [
        4,
        8,
        16,
        32,
        64,
        64,
    ]
    # arrivals a second apart: the quiet must last five gaps before any growth
    assert target_window(policy, 64, 0, 4.9, mean_gap=1.0) == 2
    assert target_window(policy, 64, 0, 5.0, mean_gap=1.0) == 4
    assert next_change(policy, 4.0, mean_gap=1.0) == pytest.approx(1.0)
    assert next_change(policy, 5.2, mean_gap=1.0) == pytest.approx(0.3)
    assert policy.hold(mean_gap=3600) == MAX_QUIET_SECONDS
    at_once = BackoffPolicy(busy_window=2, quiet_seconds=0.1, regrow_seconds=0)
    assert target_window(at_once, 64, 0, 0.1) == 64


def test_online_arrivals_give_the_mean_gap() -> None:
    from worker.traffic import OnlineTraffic

    traffic = OnlineTraffic()
    traffic.arrived(now=10.0)
    assert traffic.mean_gap is None
    for t in (11.0, 12.0, 13.0):
        traffic.arrived(now=t)
    assert traffic.mean_gap == pytest.approx(1.0)
    traffic.arrived(now=23.0)  # a ten-second gap moves the mean, not all the way
    assert traffic.mean_gap == pytest.approx(0.8 + 0.2 * 10)


def test_the_batch_window_follows_online_traffic() -> None:
    from worker.backoff import BackoffPolicy, follow_online_traffic
    from worker.traffic import OnlineTraffic, UsageTally

    policy = BackoffPolicy(busy_window=2, quiet_seconds=0.1, regrow_seconds=0.05)

    async def scenario() -> list[int]:
        traffic = OnlineTraffic()
        scheduler = Scheduler(FakeEngine(delay=0.01), window=8)
        follower = asyncio.create_task(follow_online_traffic(traffic, scheduler, policy))
        seen = []
        await asyncio.sleep(0.02)
        seen.append(scheduler.window)
        traffic.arrived()
        await asyncio.sleep(0.02)
        seen.append(scheduler.window)
        traffic.started()
        traffic.left("proj_a", True, UsageTally(requests=1, output_tokens=3))
        await asyncio.sleep(0.05)
        seen.append(scheduler.window)  # still within the quiet period
        await asyncio.sleep(0.075)
        seen.append(scheduler.window)  # the first doubling
        await asyncio.sleep(0.2)
        seen.append(scheduler.window)
        follower.cancel()
        assert traffic.take_usage() == {"proj_a": UsageTally(requests=1, output_tokens=3)}
        return seen

    assert asyncio.run(scenario()) == [8, 2, 2, 4, 8]
