"""A "public host" for sandbox egress tests: an HTTP server on the loopback alias 127.0.0.2, which
a test allow-lists (XAGENT_OUTBOUND_ALLOWED_HOSTS) so that no traffic ever leaves loopback."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

STAND_IN = "127.0.0.2"


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from the public stand-in, path {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def public_stand_in() -> Iterator[int]:
    """Serve the stand-in while the block runs; yields its port."""
    server = http.server.ThreadingHTTPServer((STAND_IN, 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
