"""An open deployment against the operator's own browser: requests exactly as a page's
forms, `no-cors` fetches and DNS-rebound names send them are refused, with OpenAI's error
envelope; same-origin pages, curl and the SDK go on as before, and keyed mode is untouched."""

import httpx
import openai

from app.config import Settings
from app.db.session import session_scope
from app.services.auth import create_key
from tests.forms import Part, content_type, multipart
from tests.harness import RunningServer, running_server
from tests.spec import assert_error

EVIL = "http://evil.example"
UPLOAD = b'{"purpose": "batch", "filename": "a.jsonl", "bytes": 3, "mime_type": "text/jsonl"}'
NEW_ADMIN = b'{"project": "default", "role": "admin"}'
# curl -d '…': no JSON content type, as in many hand-written scripts.
CURL_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def no_cors_fetch(origin: str) -> dict[str, str]:
    """What `fetch(url, {method: "POST", mode: "no-cors", body: "{…}"})` on `origin` sends."""
    return {
        "Origin": origin,
        "Content-Type": "text/plain;charset=UTF-8",
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "no-cors",
        "Sec-Fetch-Dest": "empty",
    }


def form_post(origin: str, form_type: str) -> dict[str, str]:
    """What a page's auto-submitted `<form method=post>` sends."""
    return {
        "Origin": origin,
        "Content-Type": form_type,
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Dest": "document",
    }


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_a_page_cannot_make_itself_an_admin_key(server: RunningServer, http: httpx.Client) -> None:
    refused = http.post("/v1/admin/api_keys", content=NEW_ADMIN, headers=no_cors_fetch(EVIL))
    error = assert_error(refused, 403, message="Origin http://evil.example")
    assert error["code"] == "cross_origin_request"
    assert "OVERNIGHT_ALLOWED_HOSTS" in error["message"]
    # A sandboxed frame or a local file sends `Origin: null`.
    null = http.post("/v1/admin/api_keys", content=NEW_ADMIN, headers=no_cors_fetch("null"))
    assert assert_error(null, 403)["code"] == "cross_origin_request"
    # Without an Origin (an older browser), the content type alone gives the page away.
    plain = {"Content-Type": "text/plain;charset=UTF-8"}
    untyped = assert_error(http.post("/v1/admin/api_keys", content=NEW_ADMIN, headers=plain), 415)
    assert untyped["code"] == "unsupported_media_type"
    assert "Content-Type: application/json" in untyped["message"]
    fetch_marked = {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}
    marked = http.post("/v1/admin/api_keys", content=NEW_ADMIN, headers=fetch_marked)
    assert assert_error(marked, 403, message="Sec-Fetch-Site")["code"] == "cross_origin_request"

    # No CORS: a preflight is answered without any Access-Control-Allow-* header.
    preflight = http.options(
        "/v1/admin/api_keys",
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]
    assert http.get("/v1/admin/api_keys").json()["data"] == []
    assert http.get("/readyz").json()["access"] == "open"


def test_a_page_cannot_post_forms(server: RunningServer, http: httpx.Client) -> None:
    form = multipart(Part("purpose", b"batch"), Part("file", b"{}\n", filename=b"a.jsonl"))
    upload = http.post(
        "/v1/files", content=form, headers=form_post(EVIL, content_type()["Content-Type"])
    )
    assert_error(upload, 403, message="Origin http://evil.example")
    urlencoded = form_post(EVIL, "application/x-www-form-urlencoded")
    assert_error(http.post("/v1/uploads", content=UPLOAD, headers=urlencoded), 403)
    login = http.post("/dashboard/login", data={"key": "x"}, headers={"Origin": EVIL})
    assert_error(login, 403)
    assert http.get("/v1/files").json()["data"] == []

    # The server's own pages may: their Origin is the Host they were served from.
    own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
    same_origin = http.post("/v1/files", content=form, headers=own | content_type())
    assert same_origin.status_code == 200, same_origin.text
    as_json = own | {"Content-Type": "application/json"}
    assert http.post("/v1/uploads", content=UPLOAD, headers=as_json).status_code == 200


def test_a_rebound_name_reads_nothing(server: RunningServer, http: httpx.Client) -> None:
    port = port_of(server)
    for path in ("/v1/files", "/dashboard", "/metrics"):
        rebound = http.get(path, headers={"Host": f"evil.example:{port}"})
        error = assert_error(rebound, 403, message="'evil.example:")
        assert error["code"] == "host_not_allowed"
        assert "OVERNIGHT_ALLOWED_HOSTS" in error["message"]
    for host in ("localhost", "app.localhost", "127.0.0.1", "127.0.0.2", "[::1]", "10.1.2.3"):
        answered = http.get("/v1/files", headers={"Host": f"{host}:{port}"})
        assert answered.status_code == 200, (host, answered.text)


def test_the_operator_lists_more_names(settings: Settings) -> None:
    listed = settings.model_copy(update={"allowed_hosts": ["ops.example"]})
    with running_server(listed) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        port = port_of(server)
        host = {"Host": f"ops.example:{port}"}
        assert http.get("/v1/files", headers=host).status_code == 200
        # Its pages are trusted too, whatever their port.
        page = host | {"Origin": "https://ops.example:3000", "Content-Type": "application/json"}
        assert http.post("/v1/uploads", content=UPLOAD, headers=page).status_code == 200
        assert_error(http.get("/v1/files", headers={"Host": f"other.example:{port}"}), 403)


def test_keys_make_curl_forms_welcome_again(server: RunningServer, settings: Settings) -> None:
    with httpx.Client(timeout=60, base_url=server.url) as http:
        assert_error(http.post("/v1/uploads", content=UPLOAD, headers=CURL_FORM), 415)
        # A key made on the server's machine (`overnight keys create`) closes open mode,
        # though this process has served no keyless request since.
        with session_scope(server.settings) as session:
            secret = create_key(session, "default", role="admin")[1]
        bearer = {"Authorization": f"Bearer {secret}"}
        curl = http.post("/v1/uploads", content=UPLOAD, headers=CURL_FORM | bearer)
        assert curl.status_code == 200, curl.text

    # Started with keys: curl's default form type, any Host and any Origin, as ever.
    keyed = settings.model_copy(update={"admin_key": "sk-guard-admin"})
    with running_server(keyed) as started, httpx.Client(timeout=60, base_url=started.url) as http:
        anywhere = {"Host": f"api.example:{port_of(started)}", "Origin": EVIL}
        bearer = {"Authorization": "Bearer sk-guard-admin"}
        curl = http.post("/v1/uploads", content=UPLOAD, headers=CURL_FORM | anywhere | bearer)
        assert curl.status_code == 200, curl.text
        assert_error(http.post("/v1/uploads", content=UPLOAD, headers=CURL_FORM), 401)
        sdk = openai.OpenAI(base_url=started.base_url, api_key="sk-guard-admin", max_retries=0)
        made = sdk.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
        assert sdk.files.retrieve(made.id).bytes == 3
