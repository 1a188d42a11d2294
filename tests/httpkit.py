"""An HTTP server on loopback in a thread of the test process, for the reward-server tests of
tests/runtime and tests/launch (imported as `httpkit`)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    """Serves POST /score on 127.0.0.1 while in a `with` block; a subclass's `answer(handler,
    body)` replies to each request (its body as bytes), `reply` being the usual answer."""

    def __init__(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802  (http.server's name)
                owner.answer(self, self.rfile.read(int(self.headers["Content-Length"])))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        raise NotImplementedError

    @staticmethod
    def reply(handler: BaseHTTPRequestHandler, status: int, data: bytes,
              content_type: str = "application/json") -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
