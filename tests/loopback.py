"""A loopback HTTP server in a thread, standing in for data sets' publishers (tests of downloads
and derivations): a module, not the conftest, so that several test modules import it."""

from __future__ import annotations

import http.server
import re
import threading


class Server:
    """A loopback HTTP server of ``files`` (name → bytes) that honours ``Range: bytes=N-``, can
    cut its next answer short (``cut``: bytes sent before the connection drops) and records every
    request's path and Range header."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.requests, self.cut = files, [], None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                asked = self.headers.get("Range")
                server.requests.append((self.path, asked))
                body = server.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1)) if asked else 0
                self.send_response(206 if asked else 200)
                if asked:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                part = body[start:]
                if server.cut is not None:
                    part, server.cut = part[: server.cut], None
                    self.wfile.write(part)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(part)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
