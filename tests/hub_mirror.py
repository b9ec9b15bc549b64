"""A Hugging Face hub on loopback: the routes huggingface_hub calls, served from local folders.

Point `HF_ENDPOINT` at `Mirror.url` and the real resolution code (huggingface_hub's
`hf_hub_download`, `snapshot_download`, `model_info`, `list_repo_tree`, as vLLM and
transformers call them) downloads from here into `HF_HOME`, exactly as from the hub.
Routes (huggingface_hub 2.x): `HEAD|GET /{repo}/resolve/{revision}/{path}`,
`GET /api/models/{repo}[/revision/{revision}]`, `GET /api/models/{repo}/tree/{revision}[/{path}]`.
"""

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$")


@dataclass
class Mirror:
    url: str
    repos: dict[str, Path]
    # A repo listed here answers only requests bearing this token (a private model).
    tokens: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def served(self, suffix: str) -> list[str]:
        """Paths of the successful GETs ending in `suffix`."""
        return [
            path for method, path, _ in self.requests if method == "GET" and path.endswith(suffix)
        ]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _etag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    mirror: Mirror

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.mirror.requests.append((self.command, path, self.headers.get("Authorization")))
        for pattern, route in ((_RESOLVE, self._resolve), (_TREE, self._tree), (_INFO, self._info)):
            if match := pattern.match(path):
                folder = self._repo(match["repo"])
                if folder is not None:
                    route(folder, match.groupdict(), body)
                return
        self._error(404, "EntryNotFound", body)

    def _repo(self, repo: str) -> Path | None:
        folder = self.mirror.repos.get(repo)
        token = self.mirror.tokens.get(repo)
        if folder is None or (token and self.headers.get("Authorization") != f"Bearer {token}"):
            # The hub answers 401 for a repo that is missing or that the caller may not see.
            self._error(401, "RepoNotFound", self.command == "GET")
            return None
        return folder

    def _resolve(self, folder: Path, match: dict[str, str], body: bool) -> None:
        file = folder / match["path"]
        if not file.is_file():
            self._error(404, "EntryNotFound", body, commit=True)
            return
        data = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{_etag(file)}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _info(self, folder: Path, match: dict[str, str], body: bool) -> None:
        repo = next(name for name, f in self.mirror.repos.items() if f == folder)
        siblings = [{"rfilename": str(p.relative_to(folder))} for p in _files(folder)]
        self._json({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings}, body)

    def _tree(self, folder: Path, match: dict[str, str], body: bool) -> None:
        base = folder / (match.get("path") or "")
        entries = [
            {"type": "file", "path": str(p.relative_to(folder)), "size": p.stat().st_size,
             "oid": _etag(p)}
            for p in _files(base)
        ]  # fmt: skip
        self._json(entries, body)

    def _json(self, value: object, body: bool) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, body: bool, commit: bool = False) -> None:
        data = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if commit:
            self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)


@contextmanager
def hub_mirror(repos: dict[str, Path], tokens: dict[str, str] | None = None) -> Iterator[Mirror]:
    """Serves `repos` (hub id → folder) on a free loopback port until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    mirror = Mirror(f"http://127.0.0.1:{server.server_address[1]}", repos, tokens or {})
    server.RequestHandlerClass = type("Handler", (_Handler,), {"mirror": mirror})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()
