"""A tiny stand-in for the Hugging Face Hub on localhost, reached through HF_ENDPOINT.

It answers the two requests huggingface_hub makes for one file (HEAD then GET of
/<repo>/resolve/<revision>/<file>) with the headers the real Hub sends (X-Repo-Commit, ETag,
X-Error-Code for errors). No network beyond 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}  # repo id -> config.json bytes
        self.gated: set[str] = set()
        self.no_config: set[str] = set()
        self.declared_size: dict[str, int] = {}  # repo id -> Content-Length to claim
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _answer(self, body: bool) -> None:
                hub.requests.append(f"{self.command} {self.path}")
                parts = self.path.split("/")
                # /org/name/resolve/rev/config.json
                if len(parts) < 6 or parts[3] != "resolve":
                    return self._error(404, "RepoNotFound")
                repo = f"{parts[1]}/{parts[2]}"
                if repo in hub.gated:
                    if self.headers.get("authorization") == "Bearer hf_good":
                        pass
                    else:
                        return self._error(401, "GatedRepo", "Access to model is restricted.")
                if repo in hub.no_config:
                    return self._error(404, "EntryNotFound")
                if repo not in hub.files and repo not in hub.gated:
                    return self._error(404, "RepoNotFound")
                data = hub.files.get(repo, b"{}")
                etag = hashlib.sha1(data).hexdigest()
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(hub.declared_size.get(repo, len(data))))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _error(self, status: int, code: str, msg: str = "not found") -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", msg)
                payload = json.dumps({"error": msg}).encode()
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
