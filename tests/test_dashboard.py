"""The dashboard over plain HTTP: login, escaping, feeds, actions and downloads."""

import re
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.config import Settings
from tests import batch_sim
from tests.harness import RunningServer, running_server

ADMIN_KEY = "sk-admin-dashboard-test"
HOSTILE_NAME = "<script>alert('name')</script>.jsonl"
HOSTILE_META = "<img src=x onerror=alert(1)>"
ACTION = {"x-overnight-dashboard": "1"}


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    keyed = settings.model_copy(update={"admin_key": ADMIN_KEY, "shard_lines": 4})
    with running_server(keyed) as running:
        yield running


@pytest.fixture
def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)


def logged_in(server: RunningServer) -> httpx.Client:
    browser = httpx.Client(base_url=server.url, timeout=30)
    response = browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard"})
    assert response.status_code == 303
    assert response.headers["location"] == "/dashboard"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/dashboard" in cookie
    return browser


def hostile_batch(sdk: openai.OpenAI, lines: int = 9) -> str:
    f = sdk.files.create(file=(HOSTILE_NAME, batch_sim.requests_file(lines)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"note": HOSTILE_META},
    )
    deadline = time.monotonic() + 30
    while sdk.batches.retrieve(batch.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return batch.id


def test_login_is_required_and_checked(server: RunningServer, sdk: openai.OpenAI) -> None:
    anonymous = httpx.Client(base_url=server.url, timeout=30)
    page = anonymous.get("/dashboard/workers?x=1")
    assert page.status_code == 303
    assert page.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Fworkers%3Fx%3D1"
    form = anonymous.get(page.headers["location"])
    assert (
        form.status_code == 200
        and 'name="key"' in form.text
        and "www-authenticate" not in form.headers
    )
    feed = anonymous.get("/dashboard/api/batches")
    assert feed.status_code == 401 and feed.json()["error"]["message"]
    assert anonymous.get("/dashboard/files/file-x/content").status_code == 303

    wrong = anonymous.post("/dashboard/login", data={"key": "sk-wrong", "next": "/dashboard"})
    assert wrong.status_code == 401 and "That is not an admin key." in wrong.text
    member = sdk.post("/admin/api_keys", body={"project": "p"}, cast_to=dict)["value"]
    refused = anonymous.post("/dashboard/login", data={"key": member})
    assert refused.status_code == 401
    # No open redirect: `next` stays inside the dashboard.
    away = anonymous.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "//evil.example/"})
    assert away.headers["location"] == "/dashboard"

    browser = logged_in(server)
    assert browser.get("/dashboard/workers").status_code == 200
    out = browser.post("/dashboard/logout")
    assert out.status_code == 303
    browser.cookies.clear()
    assert browser.get("/dashboard").status_code == 303


def test_the_cookie_is_secure_when_a_trusted_proxy_took_https(settings: Settings) -> None:
    # The proxy connects from 127.0.0.2: not loopback's usual 127.0.0.1, which uvicorn
    # trusts by default, so only the setting can make it believed.
    proxied = settings.model_copy(
        update={"admin_key": ADMIN_KEY, "forwarded_allow_ips": ["127.0.0.2"]}
    )
    with running_server(proxied) as server:

        def cookie_flags(source: str, headers: dict[str, str]) -> set[str]:
            transport = httpx.HTTPTransport(local_address=source)
            with httpx.Client(timeout=60, base_url=server.url, transport=transport) as browser:
                login = browser.post("/dashboard/login", data={"key": ADMIN_KEY}, headers=headers)
            assert login.status_code == 303
            return {flag.strip().lower() for flag in login.headers["set-cookie"].split(";")}

        https = {"X-Forwarded-Proto": "https"}
        assert "secure" in cookie_flags("127.0.0.2", https)
        assert "secure" not in cookie_flags("127.0.0.2", {})  # plain HTTP all the way
        assert "secure" not in cookie_flags("127.0.0.3", https)  # anyone else is not believed


def test_user_strings_are_escaped(server: RunningServer, sdk: openai.OpenAI) -> None:
    batch_id = hostile_batch(sdk)
    sdk.post("/admin/api_keys", body={"project": "<svg onload=alert(3)>"}, cast_to=dict)
    browser = logged_in(server)
    for path in (
        "/dashboard",
        "/dashboard/overview",
        f"/dashboard?q={HOSTILE_META}",
        f"/dashboard/batches/{batch_id}",
        "/dashboard/files",
        "/dashboard/keys",
    ):
        page = browser.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert "<svg onload" not in page.text, path
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    detail = browser.get(f"/dashboard/batches/{batch_id}").text
    assert "&lt;img src=x onerror=alert(1)&gt;" in detail
    assert "&lt;script&gt;alert(&#39;name&#39;)&lt;/script&gt;.jsonl" in detail
    # Every script the pages load is the dashboard's own file: no inline code.
    assert re.findall(r"<script[^>]*>", detail) == [
        '<script src="/dashboard/static/dashboard.js" defer>'
    ]


def test_feeds_show_live_progress(
    server: RunningServer, sdk: openai.OpenAI, settings: Settings
) -> None:
    batch_id = hostile_batch(sdk, lines=9)
    browser = logged_in(server)
    row = browser.get("/dashboard/api/batches").json()["rows"][0]
    assert (row["id"], row["status"], row["total"], row["completed"] + row["failed"]) == (
        batch_id,
        "in_progress",
        9,
        0,
    )
    settings = server.settings
    claim = batch_sim.claim_shard(settings, "sim", batch_id)
    assert claim is not None
    batch_sim.run_shard(settings, claim, chunk_lines=2)
    row = browser.get("/dashboard/api/batches").json()["rows"][0]
    api = sdk.batches.retrieve(batch_id).request_counts
    assert api is not None
    assert (row["completed"], row["failed"]) == (api.completed, api.failed)
    assert row["completed"] + row["failed"] == 4
    assert row["progress_pct"] == pytest.approx(100 * 4 / 9, abs=0.1)
    detail = browser.get(f"/dashboard/api/batches/{batch_id}").json()
    assert detail["metadata"] == [{"key": "note", "value": HOSTILE_META}]
    assert detail["input_name"] == HOSTILE_NAME
    assert sum(rate for _t, rate in detail["series"]) > 0
    assert detail["cancellable"] is True
    # Filters.
    assert browser.get("/dashboard/api/batches?status=completed").json()["rows"] == []
    assert len(browser.get("/dashboard/api/batches?status=in_progress").json()["rows"]) == 1


def test_cancel_and_downloads(server: RunningServer, sdk: openai.OpenAI) -> None:
    batch_id = hostile_batch(sdk, lines=9)
    browser = logged_in(server)
    cancel = f"/dashboard/api/batches/{batch_id}/cancel"
    # Only the dashboard's own script may act (it sends the header a form cannot).
    assert browser.post(cancel).status_code == 403
    assert sdk.batches.retrieve(batch_id).status == "in_progress"
    done = browser.post(cancel, headers=ACTION)
    assert done.status_code == 200 and done.json()["status"] == "cancelling"
    deadline = time.monotonic() + 30
    while (batch := sdk.batches.retrieve(batch_id)).status != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = browser.post(cancel, headers=ACTION)
    assert again.status_code == 200  # cancelling a cancelled batch changes nothing
    completed_cancel = browser.post("/dashboard/api/batches/batch_nope/cancel", headers=ACTION)
    assert completed_cancel.status_code == 404

    detail = browser.get(f"/dashboard/api/batches/{batch_id}").json()
    assert detail["status"] == "cancelled" and detail["cancellable"] is False
    assert batch.error_file_id and detail["error_href"].endswith(f"/{batch.error_file_id}/content")
    download = browser.get(detail["error_href"])
    assert download.status_code == 200
    assert download.content == sdk.files.content(batch.error_file_id).content
    assert b"batch_cancelled" in download.content
    assert download.headers["content-disposition"].startswith("attachment;")
    inp = browser.get(detail["input_href"])
    assert inp.content == sdk.files.content(batch.input_file_id).content
    assert "filename*=UTF-8''%3Cscript%3E" in inp.headers["content-disposition"]
    assert browser.get("/dashboard/files/file-nope/content").status_code == 404

    preview = browser.get(f"/dashboard/api/files/{batch.error_file_id}/preview").json()
    assert [line["text"] for line in preview["lines"]] == download.text.splitlines()
    assert preview["caption"] == "Showing the whole file."
    delete = f"/dashboard/api/files/{batch.input_file_id}/delete"
    assert browser.post(delete).status_code == 403  # only the dashboard's own script deletes
    done = browser.post(delete, headers=ACTION)
    assert done.json() == {"id": batch.input_file_id, "deleted": True}
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(batch.input_file_id)
    assert browser.post(delete, headers=ACTION).status_code == 404


def test_keys_page_actions(server: RunningServer, sdk: openai.OpenAI) -> None:
    browser = logged_in(server)
    made = browser.post(
        "/dashboard/api/keys", json={"project": "team-a", "role": "member"}, headers=ACTION
    )
    assert made.status_code == 200
    secret, row = made.json()["value"], made.json()["row"]
    assert openai.OpenAI(base_url=server.base_url, api_key=secret).files.list().data == []
    assert [r["id"] for r in browser.get("/dashboard/api/keys").json()["rows"]] == [row["id"]]
    bad = browser.post("/dashboard/api/keys", json={"project": ""}, headers=ACTION)
    assert bad.status_code == 400 and "project" in bad.json()["error"]["message"]
    assert browser.post(row["revoke_url"]).status_code == 403
    assert browser.post(row["revoke_url"], headers=ACTION).status_code == 200
    assert browser.get("/dashboard/api/keys").json()["rows"] == []
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key=secret, max_retries=0).files.list()


def test_keys_page_sets_a_projects_enqueued_limits(
    server: RunningServer, sdk: openai.OpenAI
) -> None:
    browser = logged_in(server)
    sdk.post("/admin/api_keys", body={"project": "team-a"}, cast_to=dict)
    project_id = sdk.get("/admin/projects/team-a/limits", cast_to=dict)["data"][0]["project_id"]
    url = f"/dashboard/api/projects/{project_id}/limits"
    form = {"model": batch_sim.MODEL, "token_limit": "2000000", "request_limit": ""}
    assert browser.post(url, json=form).status_code == 403  # no dashboard header
    made = browser.post(url, json=form, headers=ACTION)
    line = f"{batch_sim.MODEL}: 2,000,000 tokens (own), unlimited requests (default)"
    assert made.status_code == 200 and made.json() == {"id": project_id, "limits": line}
    listed = sdk.get("/admin/projects/team-a/limits", cast_to=dict)["data"]
    [own] = [r for r in listed if r["model"] == batch_sim.MODEL]
    assert (own["token_limit_override"], own["request_limit_override"]) == (2_000_000, None)
    page = browser.get("/dashboard/keys").text
    assert line in page and f'action="{url}"' in page
    bad = browser.post(url, json={**form, "token_limit": "-5"}, headers=ACTION)
    assert bad.status_code == 400 and "token_limit" in bad.json()["error"]["message"]
    cleared = browser.post(url, json={**form, "token_limit": ""}, headers=ACTION)
    assert cleared.json()["limits"].endswith(
        "unlimited tokens (default), unlimited requests (default)"
    )
    assert line not in browser.get("/dashboard/keys").text


def test_keys_page_sets_a_projects_quotas(server: RunningServer, sdk: openai.OpenAI) -> None:
    browser = logged_in(server)
    sdk.post("/admin/api_keys", body={"project": "team-q"}, cast_to=dict)
    project_id = sdk.get("/admin/projects/team-q/quotas", cast_to=dict)["project_id"]
    url = f"/dashboard/api/projects/{project_id}/quotas"
    form = {
        "max_stored_bytes": "1000000",
        "max_files": "",
        "max_open_uploads": "3",
        "max_unfinished_batches": "",
    }
    assert browser.post(url, json=form).status_code == 403  # no dashboard header
    made = browser.post(url, json=form, headers=ACTION)
    lines = [
        "stored bytes: 0 of 1,000,000 (own)",
        "files: 0 of unlimited (default)",
        "open uploads: 0 of 3 (own)",
        "unfinished batches: 0 of unlimited (default)",
    ]
    assert made.status_code == 200 and made.json() == {"id": project_id, "quotas": lines}
    found = sdk.get("/admin/projects/team-q/quotas", cast_to=dict)
    assert found["stored_bytes"] == {"used": 0, "limit": 1_000_000, "override": 1_000_000}
    page = browser.get("/dashboard/keys").text
    assert lines[0] in page and f'action="{url}"' in page and 'value="1000000"' in page
    bad = browser.post(url, json={**form, "max_files": "-5"}, headers=ACTION)
    assert bad.status_code == 400 and "max_files" in bad.json()["error"]["message"]
    cleared = browser.post(url, json=dict.fromkeys(form, ""), headers=ACTION)
    assert cleared.json()["quotas"][0] == "stored bytes: 0 of unlimited (default)"


def test_open_mode_needs_no_login(settings: Settings) -> None:
    with running_server(settings) as server:
        http = httpx.Client(base_url=server.url, timeout=30)
        page = http.get("/dashboard")
        assert page.status_code == 200 and "Open mode" in page.text
        assert http.get("/").headers["location"] == "/dashboard"
        # The first admin key made here keeps this browser logged in.
        made = http.post(
            "/dashboard/api/keys", json={"project": "ops", "role": "admin"}, headers=ACTION
        )
        assert made.status_code == 200 and "overnight_admin=" in made.headers["set-cookie"]
        assert http.get("/dashboard").status_code == 200
        assert httpx.get(server.url + "/dashboard").status_code == 303


def test_validation_errors_show_with_line_numbers(
    server: RunningServer, sdk: openai.OpenAI
) -> None:
    hostile = batch_sim.request_line("<script>alert('id')</script>")
    data = batch_sim.jsonl([hostile, b'{"custom_id": <b>', hostile])
    f = sdk.files.create(file=("bad.jsonl", data), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 30
    while (found := sdk.batches.retrieve(batch.id)).status != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert found.errors is not None and found.errors.data
    errors = found.errors.data
    browser = logged_in(server)
    detail = browser.get(f"/dashboard/api/batches/{batch.id}").json()
    assert detail["has_errors"] is True
    assert [e["line"] for e in detail["errors"]] == [str(e.line) for e in errors]
    assert {"2", "3"} <= {e["line"] for e in detail["errors"]}
    page = browser.get(f"/dashboard/batches/{batch.id}").text
    for error in errors:
        assert f'data-field="line">{error.line}</td>' in page
    assert "<script>alert" not in page and "<b>" not in page.split("<main>")[1]
