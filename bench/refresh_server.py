#!/usr/bin/env python3
"""A loopback OAuth2 token endpoint for the storescale benchmark (issue 16).

Tests/servers/token_server.py knows only the grants it issued itself; the
benchmark's sessions are written straight into the database (BenchSeed.swift),
so their refresh tokens were never issued by a server. This one answers every
well-formed refresh_token grant with new tokens of real sizes (an access
token of 180 characters, a refresh token of 100, `expires_in` LIFETIME) and
remembers when each refresh came, nothing else. Stdlib only; 127.0.0.1 only.

  refresh_server.py LIFETIME      prints `LISTENING http://127.0.0.1:PORT`
  POST /token          grant_type=refresh_token&refresh_token=...&client_id=...
  POST /revoke         200, empty
  GET  /stats          {"refreshes": N, "times": [unix seconds of each], "bad": N}
"""
import json, os, secrets, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

LIFETIME = int(sys.argv[1]) if len(sys.argv) > 1 else 4575
lock = threading.Lock()
times, bad = [], [0]


def token(head, size):
    return (head + secrets.token_urlsafe(size))[:size]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for the client's ACK

    def log_message(self, fmt, *args):
        pass

    def send(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/revoke":
            self.send(200)
            return
        form = {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}
        if self.path != "/token" or form.get("grant_type") != "refresh_token" or not form.get("refresh_token"):
            with lock:
                bad[0] += 1
            self.send(400, b'{"error":"invalid_request"}')
            return
        body = json.dumps({"access_token": token("ya29.a0", 180), "refresh_token": token("1//0g", 100),
                           "token_type": "Bearer", "expires_in": LIFETIME}).encode()
        with lock:
            times.append(time.time())
        self.send(200, body)

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                body = json.dumps({"refreshes": len(times), "times": list(times), "bad": bad[0]}).encode()
            self.send(200, body)
        else:
            self.send(404)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # Straight out: a SystemExit raised in serve_forever could wait on request threads.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"LISTENING http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
