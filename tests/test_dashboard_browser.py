"""The dashboard in real headless Chromium, through real batches run by the real worker loop.

The worker is `worker.loop.Worker` with a scripted engine (tests/fake_engine.py), so a batch
takes seconds and its pace is set per request; the vLLM path itself is covered by the engine
tests and by tests/test_docs.py. Screenshots land in test-artifacts/.
"""

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from app.config import Settings
from app.db.session import session_scope
from tests import batch_sim
from tests.engine_fixtures import chat_line, jsonl, start_batch, wait_status
from tests.fake_engine import FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, running_server
from tests.webhook_receiver import running_receiver
from worker import registry

# The pages' queries and actions run on both databases in test_dashboard.py and
# test_dashboard_views.py; here is the browser's part, once. The webhooks page has no such
# test of its own, so it runs on both.
pytestmark = pytest.mark.backends("sqlite")

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ADMIN_KEY = "sk-admin-browser-test"
HOSTILE = "<img src=x onerror=alert('xss')>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: apt-get install chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    with running_server(fast(settings, admin_key=ADMIN_KEY, shard_lines=6)) as running:
        yield running


@pytest.fixture
def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)


class Alerts:
    """Records dialogs: an alert would mean that injected script ran."""

    def __init__(self) -> None:
        self.alerts: list[str] = []

    def __call__(self, dialog: Dialog) -> None:
        if dialog.type == "confirm":
            dialog.accept()
        else:
            self.alerts.append(dialog.message)
            dialog.dismiss()


# A live page shows a change at its next refresh, after the change itself (a worker's
# registration, say): on a busy 2-core machine that took longer than Playwright's 5 s.
expect.set_options(timeout=20_000)


def open_page(browser: Browser, server: RunningServer, width: int = 1280) -> tuple[Page, Alerts]:
    page = browser.new_page(viewport={"width": width, "height": 900}, accept_downloads=True)
    page.set_default_timeout(30_000)
    alerts = Alerts()
    page.on("dialog", alerts)
    return page, alerts


def log_in(page: Page, server: RunningServer, path: str = "/dashboard") -> None:
    page.goto(server.url + path)
    expect(page.locator("h1")).to_have_text("Log in")
    page.fill("#key", "sk-not-it")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_have_text("That is not an admin key.")
    page.fill("#key", ADMIN_KEY)
    page.click("button[type=submit]")
    expect(page).to_have_url(server.url + path)


def phone_page(browser: Browser, server: RunningServer, logged_in: Page) -> tuple[Page, Alerts]:
    """A 390 px page with the login of `logged_in`."""
    phone, alerts = open_page(browser, server, width=390)
    phone.context.add_cookies(
        [
            {"name": c["name"], "value": c["value"], "url": server.url}
            for c in logged_in.context.cookies()
        ]
    )
    return phone, alerts


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def no_horizontal_scroll(page: Page) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px"


def fits_phone(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px phone"


def phone_like(browser: Browser, server: RunningServer, page: Page) -> Page:
    """A 390 px page logged in as `page` is."""
    phone, _alerts = open_page(browser, server, width=390)
    cookies = page.context.cookies()
    phone.context.add_cookies(
        [{"name": c["name"], "value": c["value"], "url": server.url} for c in cookies]
    )
    return phone


def slow_lines(n: int, delay: float, prefix: str = "r") -> bytes:
    return jsonl([chat_line(f"{prefix}-{i}", delay=delay) for i in range(n)])


def test_batch_runs_live_and_downloads(
    browser: Browser, server: RunningServer, sdk: openai.OpenAI, backend: str
) -> None:
    page, alerts = open_page(browser, server)
    log_in(page, server)
    lines = [chat_line(f"ok-{i}", delay=1.0) for i in range(23)]
    lines.append(
        orjson.dumps(
            {
                "custom_id": "bad",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "SmolLM2-135M-Instruct", "prompt": "no messages"},
            }
        )
    )
    f = sdk.files.create(file=(f"{HOSTILE}.jsonl", jsonl(lines)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"owner": HOSTILE},
    )
    wait_status(sdk, batch.id, "in_progress")
    # The new batch appears without a reload.
    row = page.locator(f'tr[data-key="{batch.id}"]')
    expect(row.locator('[data-field="status"]')).to_have_text("in_progress")
    expect(row.locator('[data-field="total"]')).to_have_text("24")

    seen: list[float] = []
    with ThreadedWorker(server.settings, FakeEngine(max_num_seqs=2)):
        deadline = time.monotonic() + 60
        while row.locator('[data-field="status"]').inner_text() != "completed":
            value = row.locator("svg.stack").evaluate("el => Number(el.dataset.pct)")
            if not seen or value != seen[-1]:
                seen.append(value)
            if len(seen) == 3:
                shot(page, f"batches-running-{backend}")
            assert time.monotonic() < deadline, f"progress stuck at {seen}"
            time.sleep(0.1)
    assert seen == sorted(seen) and len(seen) >= 3, f"the bar did not advance live: {seen}"
    expect(row.locator("svg.stack")).to_have_attribute("data-pct", re.compile(r"^100(\.0)?$"))
    # The stacked bar: 23 of 24 completed, 1 failed, none cancelled.
    widths = row.locator("svg.stack rect").evaluate_all(
        "rects => rects.map(r => Number(r.getAttribute('width')))"
    )
    assert widths == [pytest.approx(100 * 23 / 24, abs=0.01), pytest.approx(100 / 24, abs=0.01), 0]
    expect(row.locator('[data-field="duration"]')).not_to_have_text("—")

    row.locator('a[data-field="id"]').click()
    expect(page.locator("h1")).to_have_text(batch.id)
    expect(page.locator('[data-field="completed"]').first).to_have_text("23")
    expect(page.locator('[data-field="failed"]').first).to_have_text("1")
    expect(page.locator('.pairs [data-field="input_name"]')).to_have_text(f"{HOSTILE}.jsonl")
    expect(page.locator('[data-list="metadata"] [data-field="value"]')).to_have_text(HOSTILE)
    expect(page.locator(".timeline li")).to_contain_text(
        ["Created", "In progress", "Finalizing", "Completed"]
    )
    expect(page.locator("[data-action=cancel]")).to_be_hidden()
    # The chunks the chart was drawn from are gone; the series kept at the end remains.
    expect(page.locator(".chart rect").first).to_be_attached()
    expect(page.locator('[data-field="chart_caption"]')).to_contain_text("Peak")
    expect(page.locator('.plot [data-field="y_top"]')).not_to_have_text("")
    expect(page.locator('.plot [data-field="x_end"]')).to_have_text(re.compile(r"^\d\d:\d\d:\d\d$"))
    # The first lines of the output and error files, fetched once they exist.
    output_lines = page.locator('[data-preview="output_file_id"] li')
    expect(output_lines).to_have_count(20)
    expect(output_lines.first).to_contain_text('"custom_id":"ok-0"')
    expect(page.locator('[data-preview="error_file_id"] li')).to_contain_text(['"bad"'])
    shot(page, f"batch-completed-{backend}")

    final = sdk.batches.retrieve(batch.id)
    assert final.output_file_id and final.error_file_id
    for field, file_id in (
        ("output_href", final.output_file_id),
        ("error_href", final.error_file_id),
    ):
        with page.expect_download() as info:
            page.click(f'a[data-href="{field}"]')
        saved = Path(info.value.path())
        assert saved.read_bytes() == sdk.files.content(file_id).content
    assert alerts.alerts == []

    phone, phone_alerts = phone_page(browser, server, page)
    for path, name in (("/dashboard", "batches"), (f"/dashboard/batches/{batch.id}", "batch")):
        phone.goto(server.url + path)
        expect(phone.locator("h1")).to_be_visible()
        fits_phone(phone)
        shot(phone, f"phone-{name}-{backend}")
    assert phone_alerts.alerts == []


def test_cancel_from_the_batch_page(
    browser: Browser, server: RunningServer, sdk: openai.OpenAI, backend: str
) -> None:
    page, alerts = open_page(browser, server)
    log_in(page, server)
    batch_id = start_batch(sdk, slow_lines(40, delay=0.5), name="slow.jsonl")
    wait_status(sdk, batch_id, "in_progress")
    with ThreadedWorker(server.settings, FakeEngine(max_num_seqs=2)):
        page.goto(f"{server.url}/dashboard/batches/{batch_id}")
        completed = page.locator('.stats [data-field="completed"]')
        expect(completed).not_to_have_text("0", timeout=30_000)
        expect(page.locator(".chart rect").first).to_be_attached()
        expect(page.locator('[data-field="chart_caption"]')).to_contain_text("Peak")
        page.click("[data-action=cancel]")  # confirm() is accepted by Alerts
        expect(page.locator('h1 ~ [data-field="status"]')).to_have_text("cancelled", timeout=30_000)
    batch = sdk.batches.retrieve(batch_id)
    assert batch.status == "cancelled" and batch.request_counts is not None
    assert batch.request_counts.completed < 40
    expect(page.locator("[data-action=cancel]")).to_be_hidden()
    expect(page.locator(".timeline li")).to_contain_text(["Cancelling", "Cancelled"])
    with page.expect_download() as info:
        page.click('a[data-href="error_href"]')
    text = Path(info.value.path()).read_text()
    assert "batch_cancelled" in text
    shot(page, f"batch-cancelled-{backend}")
    assert alerts.alerts == []


def test_workers_files_and_keys_pages(
    browser: Browser, server: RunningServer, sdk: openai.OpenAI, backend: str
) -> None:
    page, alerts = open_page(browser, server)
    log_in(page, server, "/dashboard/workers")
    expect(page.locator("#workers caption.empty")).to_be_visible()
    # A worker id has the colons of host:pid:suffix: its page's URL must quote them.
    worker_id = "gpu-1:42:fake"
    with ThreadedWorker(server.settings, FakeEngine(max_num_seqs=2), worker_id=worker_id):
        row = page.locator(f'tr[data-key="{worker_id}"]')
        expect(row.locator('[data-field="state"]')).to_have_text("idle")
        expect(row.locator('[data-field="model"]')).to_have_text("SmolLM2-135M-Instruct")
        shot(page, f"workers-{backend}")
        row.locator('a[data-field="id"]').click()
        expect(page.locator("h1")).to_have_text(worker_id)
        expect(page.locator('[data-list="effective"]')).to_contain_text("max_num_seqs")
        expect(page.locator("#shards caption.empty")).to_be_visible()
        # 2 running in the engine, the rest of the window (2 x max_num_seqs) waiting.
        batch_id = start_batch(sdk, slow_lines(16, delay=1.5))
        expect(page.locator('[data-field="engine_running"]')).to_have_text("2")
        expect(page.locator('[data-field="engine_waiting"]')).to_have_text("2")
        expect(page.locator('.stats [data-field="kv_cache"]')).to_have_text("100.0%")
        shard = page.locator('#shards tbody tr[data-key="' + batch_id + '#0"]')
        expect(shard.locator('[data-field="batch"]')).to_have_text(batch_id)
        shot(page, f"worker-{backend}")
        wait_status(sdk, batch_id, "completed")
        expect(shard.locator('[data-field="status"]')).to_have_text("done")
        expect(shard.locator('[data-field="completed"]')).to_have_text("6")
        expect(page.locator('[data-field="engine_running"]')).to_have_text("0")
        phone, phone_alerts = phone_page(browser, server, page)
        phone.goto(page.url)
        expect(phone.locator("h1")).to_have_text(worker_id)
        no_horizontal_scroll(phone)
        shot(phone, f"phone-worker-{backend}")
        assert phone_alerts.alerts == []

    sdk.files.create(file=(f"{HOSTILE}.jsonl", b"{}\n"), purpose="batch")
    page.goto(server.url + "/dashboard/files")
    expect(page.locator('#files [data-field="filename"]').first).to_have_text(f"{HOSTILE}.jsonl")

    page.goto(server.url + "/dashboard/keys")
    page.fill("input[name=project]", HOSTILE)
    page.fill("input[name=name]", "ci")
    page.click("form[data-create-key] button[type=submit]")
    secret = page.locator("#new-secret-value")
    expect(page.locator("#new-secret")).to_be_visible()
    value = secret.inner_text()
    assert value.startswith("sk-ovn-")
    assert openai.OpenAI(base_url=server.base_url, api_key=value).files.list().data == []
    key_row = page.locator("#keys tbody tr")
    expect(key_row).to_have_count(1)
    expect(key_row.locator('[data-field="project"]')).to_have_text(HOSTILE)
    shot(page, f"keys-{backend}")
    key_row.locator("[data-action=revoke]").click()
    expect(page.locator("#keys tbody tr")).to_have_count(0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key=value, max_retries=0).files.list()
    # An API error shows as a message, not a crash.
    page.fill("input[name=project]", " ")
    page.click("form[data-create-key] button[type=submit]")
    expect(page.locator("#flash")).to_contain_text("project")
    # It stays through the page's polls (they clear only their own errors) until read.
    page.evaluate("refreshAll()")
    expect(page.locator("#flash")).to_contain_text("project")
    # A project's own enqueued limit, from its row of the projects table.
    page.reload()
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    project = page.locator("#projects tbody tr", has_text=HOSTILE)
    project.locator("input[name=model]").fill(batch_sim.MODEL)
    project.locator("input[name=token_limit]").fill("2000000")
    project.locator("form[action$='/limits'] button[type=submit]").click()
    expect(project.locator('[data-field="limits"]')).to_have_text(
        f"{batch_sim.MODEL}: 2,000,000 tokens (own), unlimited requests (default)"
    )
    project.locator("input[name=weight]").fill("3")
    # The field holds what was typed at once: wait for the answer and the reload after it.
    with (
        page.expect_response(lambda r: r.url.endswith("/weight")) as answer,
        page.expect_navigation(),
    ):
        project.locator("form[action$='/weight'] button[type=submit]").click()
    assert answer.value.ok, answer.value.status
    expect(project.locator("input[name=weight]")).to_have_value("3")
    # One request a form, to its own URL.
    assert [url.rsplit("/", 1)[1] for url in posts] == ["limits", "weight"], posts
    weights = {p["name"]: p["weight"] for p in sdk.get("/admin/projects", cast_to=dict)["data"]}
    assert weights[HOSTILE] == 3
    assert alerts.alerts == []


def test_retry_from_the_batch_page(
    browser: Browser, server: RunningServer, sdk: openai.OpenAI, backend: str
) -> None:
    """A cancelled batch's unrun requests become a new batch that links to the original."""
    batch_id = start_batch(sdk, jsonl([chat_line(f"r-{i}") for i in range(12)]))
    wait_status(sdk, batch_id, "in_progress")
    claim = batch_sim.claim_shard(server.settings, "browser-sim", batch_id)
    assert claim is not None
    batch_sim.run_shard(server.settings, claim)  # the first 6 run; the rest never do
    sdk.batches.cancel(batch_id)
    wait_status(sdk, batch_id, "cancelled")

    page, alerts = open_page(browser, server)
    log_in(page, server, f"/dashboard/batches/{batch_id}")
    expect(page.locator("[data-action=cancel]")).to_be_hidden()
    page.click("[data-action=retry]")  # confirm() is accepted by Alerts
    expect(page).not_to_have_url(f"{server.url}/dashboard/batches/{batch_id}")
    retry_id = page.locator("h1").inner_text()
    assert retry_id.startswith("batch_") and retry_id != batch_id
    expect(page.locator('[data-list="metadata"]')).to_contain_text(batch_id)
    retry = wait_status(sdk, retry_id, "in_progress")
    assert retry.metadata == {"retry_of": batch_id}
    assert retry.request_counts is not None and retry.request_counts.total == 6
    no_horizontal_scroll(page)  # a batch id in the metadata folds
    shot(page, f"batch-retry-{backend}")
    assert alerts.alerts == []


def test_overview_search_pages_workers_and_files(
    browser: Browser, server: RunningServer, sdk: openai.OpenAI, backend: str
) -> None:
    """The fleet pages at 1280 px and 390 px, over batches a real worker loop ran."""
    settings = server.settings
    tagged = start_batch_with(sdk, [chat_line(f"t-{i}") for i in range(4)], {"team": "vision"})
    needle = start_batch_with(sdk, [chat_line(f"n-{i}") for i in range(8)], {"team": "nlp"})
    third = start_batch_with(sdk, [chat_line(f"x-{i}") for i in range(3)], {})
    with ThreadedWorker(settings, FakeEngine(max_num_seqs=4), worker_id="fake-up"):
        for batch_id in (tagged, needle, third):
            wait_status(sdk, batch_id, "completed")
    with session_scope(settings) as session:  # a worker that ran once and stopped
        registry.register(session, "fake-old", batch_sim.MODEL)
        registry.stopped(session, "fake-old")
    long_name = "q" * 160 + ".jsonl"
    long_file = sdk.files.create(file=(long_name, b"{}\n"), purpose="batch").id

    page, alerts = open_page(browser, server)
    with registry.LoadingBeat(settings, "fake-loading", batch_sim.MODEL, every=0.5) as beat:
        log_in(page, server, "/dashboard/overview")
        expect(page.locator('[data-field="workers_loading"]')).to_have_text("1")
        expect(page.locator(".chart rect")).to_have_count(60)
        bars = page.locator(".chart rect").evaluate_all(
            "rects => rects.filter(r => Number(r.getAttribute('height')) > 0).length"
        )
        assert bars >= 1, "the last hour's requests are not drawn"
        expect(page.locator('.plot [data-field="y_top"]')).not_to_have_text("")
        expect(page.locator('.plot [data-field="x_start"]')).to_have_text(
            re.compile(r"^\d\d:\d\d$")
        )
        model_row = page.locator("#models tbody tr")
        expect(model_row.locator('[data-field="model"]')).to_have_text(batch_sim.MODEL)
        expect(model_row.locator('[data-field="workers"]')).to_contain_text("1 loading")
        project_row = page.locator("#projects tbody tr")
        expect(project_row.locator('[data-field="project"]')).to_have_text("default")
        expect(project_row.locator('[data-field="batches"]')).to_have_text("3")
        shot(page, f"overview-{backend}")

        page.goto(server.url + "/dashboard/workers")
        loading = page.locator('tr[data-key="fake-loading"]')
        expect(loading.locator('[data-field="state"]')).to_have_text("loading")
        expect(loading.locator('[data-field="uptime"]')).to_contain_text("loading")
        old = page.locator('tr[data-key="fake-old"]')
        expect(old.locator('[data-field="state"]')).to_have_text("stopped")
        expect(old.locator('[data-field="uptime"]')).to_have_text(re.compile(r"^stopped .* ago$"))
        phone = phone_like(browser, server, page)
        for name in ("overview", "workers", "keys"):
            phone.goto(f"{server.url}/dashboard/{name}")
            expect(phone.locator("h1")).to_be_visible()
            fits_phone(phone)
            shot(phone, f"phone-{name}-{backend}")
        beat.ready()

    # Search: metadata, then a custom_id (read from the input files, once, not polled).
    page.goto(server.url + "/dashboard")
    page.fill("input[name=q]", "VISION")
    page.click(".search button[type=submit]")
    expect(page.locator("#batches tbody tr")).to_have_count(1)
    expect(page.locator('#batches [data-field="id"]')).to_have_text(tagged)
    page.fill("input[name=q]", "")
    page.fill("input[name=custom_id]", "n-7")
    page.click(".search button[type=submit]")
    expect(page.locator('#batches [data-field="id"]')).to_have_text([needle])
    expect(page.locator("#search-note")).to_contain_text("Searched")
    assert page.locator("#batches tbody").get_attribute("data-live") is None
    # Pages past the newest, by cursor, and a date range with nothing in it.
    page.goto(server.url + "/dashboard?limit=2")
    expect(page.locator('#batches [data-field="id"]')).to_have_text([third, needle])
    page.click("#older")
    expect(page.locator('#batches [data-field="id"]')).to_have_text([tagged])
    expect(page.locator("#older")).to_have_count(0)
    page.fill("input[name=from]", "2001-01-01")
    page.fill("input[name=to]", "2001-01-02")
    page.click(".search button[type=submit]")
    expect(page.locator("#batches caption.empty")).to_be_visible()
    phone = phone_like(browser, server, page)
    phone.goto(server.url + "/dashboard?custom_id=n-7")
    expect(phone.locator('#batches [data-field="id"]')).to_have_text([needle])
    fits_phone(phone)
    shot(phone, f"phone-search-{backend}")

    # A long file name folds on a phone; delete asks first, then the file is gone.
    phone.goto(server.url + "/dashboard/files")
    expect(phone.locator(f'tr[data-key="{long_file}"]')).to_be_visible()
    fits_phone(phone)
    shot(phone, f"phone-files-{backend}")
    page.goto(server.url + "/dashboard/files")
    row = page.locator(f'tr[data-key="{long_file}"]')
    expect(row.locator('[data-field="filename"]')).to_have_text(long_name)
    no_horizontal_scroll(page)
    row.locator("[data-action=delete]").click()  # confirm() is accepted by Alerts
    expect(row).to_have_count(0)
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(long_file)
    assert alerts.alerts == []


def start_batch_with(sdk: openai.OpenAI, lines: list[bytes], metadata: dict[str, str]) -> str:
    f = sdk.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=metadata or None,
    )
    wait_status(sdk, batch.id, "in_progress")
    return batch.id


def assert_polls_leave_rows_in_place(page: Page, feed: str, *lists: str) -> None:
    """Two refreshes from `feed` change nothing in `lists`, so they move no row: a row moved
    in the DOM, even back to its place, loses a click whose press and release straddle it."""
    page.evaluate(
        """(lists) => {
            window.rowMoves = 0;
            const watch = new MutationObserver((seen) => { window.rowMoves += seen.length; });
            for (const list of lists) {
                watch.observe(document.querySelector(list), { childList: true });
            }
        }""",
        list(lists),
    )
    for _ in range(2):
        with page.expect_response(lambda r: r.url.endswith(feed) and r.ok):
            pass
    page.evaluate("() => new Promise(requestAnimationFrame)")  # the refresh has been applied
    assert page.evaluate("window.rowMoves") == 0


@pytest.mark.backends("sqlite", "postgresql")
def test_webhook_endpoints_page(browser: Browser, settings: Settings, backend: str) -> None:
    """Create, test, edit, disable, rotate and delete an endpoint from the page, with a real
    receiver on loopback: every delivery it gets verifies with the secret the page showed."""
    allowed = fast(settings, admin_key=ADMIN_KEY, webhook_allow_private=True)
    with running_server(allowed) as server, running_receiver() as receiver:
        sdk = openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)
        sdk.post("/admin/api_keys", body={"project": "team"}, cast_to=dict)
        page, alerts = open_page(browser, server)
        log_in(page, server, "/dashboard/webhooks")
        expect(page.locator('[data-show-empty="webhooks"]')).to_be_visible()

        form = page.locator("#new-webhook")
        form.locator("select[name=project]").select_option("team")
        form.locator("input[name=name]").fill(HOSTILE)
        form.locator("input[name=url]").fill(receiver.url)
        form.locator('input[value="batch.failed"]').uncheck()
        form.locator("button[type=submit]").click()
        expect(form.locator("[data-secret]")).to_be_visible(timeout=20_000)
        secret = page.locator("#new-webhook-secret").inner_text()
        assert secret.startswith("whsec_")
        card = page.locator("#webhooks article.endpoint")
        expect(card).to_have_count(1)
        expect(card.locator('h2 [data-field="name"]')).to_have_text(HOSTILE)
        expect(card.locator('[data-field="project"]')).to_have_text("team")
        [endpoint] = sdk.webhooks.list(extra_query={"project": "team"}).data
        assert "batch.failed" not in endpoint.event_types

        card.locator("[data-action=test]").click()
        expect(page.locator("#flash")).to_have_text("Test event sent: HTTP 200.", timeout=20_000)
        [delivery] = receiver.wait_for(1)
        event = sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
        assert event.type == "batch.completed" and event.data.id == "batch_test"
        row = card.locator('[data-list="deliveries"] tr').first
        expect(row.locator('[data-field="status"]')).to_have_text("delivered")
        expect(row.locator('[data-field="http"]')).to_have_text("200")
        expect(row.locator('[data-field="latency"]')).to_contain_text(" ms")
        feed = "/dashboard/api/webhooks"
        assert_polls_leave_rows_in_place(page, feed, "#webhooks", "#webhooks tbody")

        card.locator("details.edit summary").click()
        card.locator("form input[name=name]").fill("nightly")
        card.locator("form button[type=submit]").click()
        expect(card.locator('h2 [data-field="name"]')).to_have_text("nightly")
        card.locator("[data-action=toggle]").click()
        expect(card.locator('h2 [data-field="state"]')).to_have_text("disabled")
        assert sdk.webhooks.retrieve(endpoint.id).model_extra == {"enabled": False}

        card.locator("[data-action=rotate]").click()  # confirm() is accepted by Alerts
        expect(card.locator("[data-secret]")).to_be_visible(timeout=20_000)
        rotated = card.locator("[data-secret-value]").inner_text()
        assert rotated.startswith("whsec_") and rotated != secret
        receiver.answer = lambda _n: 503
        card.locator("[data-action=test]").click()
        expect(page.locator("#flash")).to_have_text("Test event sent: HTTP 503.", timeout=20_000)
        failed = receiver.wait_for(2)[1]
        assert sdk.webhooks.unwrap(failed.body, failed.headers, secret=rotated).type
        row = card.locator('[data-list="deliveries"] tr').first
        expect(row.locator('[data-field="status"]')).to_have_text("failed")
        expect(row.locator('[data-field="last_error"]')).to_have_text("HTTP 503:")
        shot(page, f"webhooks-{backend}")

        phone, phone_alerts = phone_page(browser, server, page)
        phone.goto(server.url + "/dashboard/webhooks")
        expect(phone.locator("#webhooks article.endpoint")).to_have_count(1)
        no_horizontal_scroll(phone)
        shot(phone, f"phone-webhooks-{backend}")

        card.locator("[data-action=delete]").click()
        expect(card).to_have_count(0)
        with pytest.raises(openai.NotFoundError):
            sdk.webhooks.retrieve(endpoint.id)
        assert alerts.alerts == [] and phone_alerts.alerts == []
