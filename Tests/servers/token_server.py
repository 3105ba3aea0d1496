#!/usr/bin/env python3
"""OAuth2 token server for vaultd's integration tests (issue 3). Stdlib only.

Run:  python3 token_server.py --port 0 [--lifetime 5] [--client-id ID]
          [--client-secret S] [--omit-expires-in] [--salesforce] [--no-rotate]
          [--no-client-refresh-token] [--id-token JSON]
          [--tls-cert CERT.pem --tls-key KEY.pem]
Binds 127.0.0.1 only, prints one line `LISTENING http://127.0.0.1:PORT` to
stdout (`LISTENING https://...` with --tls-cert: TLS with that certificate), then serves until SIGTERM/SIGINT (exit status 0). One log line per
request goes to stderr; tokens are only ever shown as their first 6 chars + "…".

Endpoints
  POST /token     RFC 6749, form-encoded. grant_type=client_credentials
                  (client_id, client_secret; no refresh token with
                  --no-client-refresh-token) or grant_type=refresh_token
                  (refresh_token, client_id). Client auth may also be HTTP Basic.
                  Refresh rotates the refresh token; presenting a rotated-away
                  one gives 400 invalid_grant "refresh token reused" and revokes
                  the whole grant. Access tokens expire after --lifetime seconds
                  on the server even when expires_in is omitted.
                  With --id-token CLAIMS (a JSON object) every token response
                  also carries an OpenID Connect id_token: an unsigned JWT
                  ("alg": "none") whose payload is CLAIMS plus iat and exp.
  POST /revoke    RFC 7009: token, token_type_hint. Always 200, empty body.
                  A refresh token revokes its whole grant; an access token only itself.
  GET  /resource  Authorization: Bearer AT -> 200 {"ok":true} if AT is live, else 401.
  POST /control/mode   JSON {"mode": normal|error500|error429|hang|slow|held|garbage|invalid_grant|
                                 close|reset|truncated|huge|huge_unannounced|down,
                       "retry_after": 1 (null: error429 sends no Retry-After),
                       "count": N (absent/null: until changed),
                       "hang_seconds": 60, "target": "token"|"revoke"|"both",
                       "body_bytes": 8388608}
                       The next N requests to the target endpoint(s) fail that way;
                       "slow" succeeds but holds the answer for hang_seconds;
                       "held" holds the answer (the tokens, or the invalid_grant a
                       reused or unknown refresh token earns) until POST /control/release
                       (at most hang_seconds), so a test orders events without timing.
                       Outage kinds (issue 13): "close" reads the request and closes
                       the connection without a byte; "reset" closes it with a TCP
                       RST; "truncated" announces a 200 body of 400 bytes and sends
                       30; "huge" answers 200 with body_bytes bytes and their
                       Content-Length, "huge_unannounced" the same without one
                       (closed at the end); "down" closes the listening socket for
                       hang_seconds (connections are refused), then listens again
                       on the same port with every token kept ("count" unused).
  POST /control/release  answers every "held" token request now waiting.
  GET  /control/stats  counters (see Stats.snapshot); POST /control/reset zeroes them
                       (tokens and the failure mode are kept).
"""

import argparse
import base64
import json
import secrets
import select
import signal
import socket
import ssl
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus

MODES = ("normal", "error500", "error429", "hang", "slow", "held", "garbage", "invalid_grant",
         "close", "reset", "truncated", "huge", "huge_unannounced", "down")
TARGETS = ("token", "revoke", "both")


def mask(token):
    """First 6 characters and an ellipsis; never the whole token."""
    if token is None:
        return None
    return token[:6] + "…"


def id_token(claims, lifetime):
    """An unsigned JWT (RFC 7519 6.1) carrying `claims`, iat and exp."""
    def part(obj):
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    issued = int(time.time())
    payload = dict(claims, iat=issued, exp=issued + int(max(lifetime, 1)))
    return part({"alg": "none", "typ": "JWT"}) + "." + part(payload) + "."


def now_ms():
    return int(time.time() * 1000)


class Grant:
    def __init__(self, grant_id, client_id, scope):
        self.grant_id = grant_id
        self.client_id = client_id
        self.scope = scope
        self.revoked = False
        self.current_refresh = None
        self.current_access = None


class State:
    """All mutable state, guarded by one lock."""

    def __init__(self, config):
        self.config = config
        self.lock = threading.Lock()
        self.grants = {}
        self.access = {}    # token -> {"grant": Grant, "expires": monotonic, "revoked": bool}
        self.refresh = {}   # token -> {"grant": Grant, "state": "current"|"used"}
        self.mode = "normal"
        self.mode_remaining = None   # None: until changed
        self.retry_after = 1
        self.hang_seconds = 60.0
        self.target = "token"
        self.body_bytes = 8 << 20
        self.down_until = None   # monotonic time the listener reopens at, while "down"
        self.release = threading.Event()   # set by /control/release: "held" answers go out
        self.held_answers = 0   # "held" answers waiting for /control/release now
        self.reset_counters()

    def reset_counters(self):
        self.token_requests = 0
        self.refresh_requests = 0
        self.client_credentials_requests = 0
        self.revoke_requests = 0
        self.revocations = []
        self.reused_refresh_tokens = 0
        self.revoked_grants = 0
        self.last_refresh_token_seen = None
        self.last_refresh_at_ms = None
        self.refresh_before_expiry = 0
        self.refresh_after_expiry = 0
        self.injected_failures = 0
        self.resource_ok = 0
        self.resource_denied = 0
        self.connections = 0
        self.tls_failures = 0
        self.huge_bytes_sent = 0

    # --- failure injection (call with the lock held) ---
    def take_failure(self, endpoint):
        """The failure to inject for this request, or None; consumes one of `count`."""
        if self.mode == "normal" or self.target not in (endpoint, "both"):
            return None
        mode = self.mode
        if self.mode_remaining is not None:
            self.mode_remaining -= 1
            if self.mode_remaining <= 0:
                self.mode, self.mode_remaining = "normal", None
        self.injected_failures += 1
        return mode

    # --- tokens (call with the lock held) ---
    def issue(self, grant, rotate=True, refresh_token=True):
        lifetime = self.config.lifetime
        at = "at_" + secrets.token_urlsafe(24)
        self.access[at] = {"grant": grant, "expires": time.monotonic() + lifetime, "revoked": False}
        grant.current_access = at
        new_rt = None
        if refresh_token and (rotate or grant.current_refresh is None):
            if grant.current_refresh is not None:
                self.refresh[grant.current_refresh]["state"] = "used"
            new_rt = "rt_" + secrets.token_urlsafe(24)
            self.refresh[new_rt] = {"grant": grant, "state": "current"}
            grant.current_refresh = new_rt
        body = {"access_token": at, "token_type": "Bearer"}
        if new_rt is not None:
            body["refresh_token"] = new_rt
        if not self.config.omit_expires_in:
            body["expires_in"] = int(lifetime) if float(lifetime).is_integer() else lifetime
        if grant.scope:
            body["scope"] = grant.scope
        if self.config.id_token:
            body["id_token"] = id_token(json.loads(self.config.id_token), lifetime)
        if self.config.salesforce:
            body["issued_at"] = str(now_ms())   # Salesforce sends a string of milliseconds
            body["instance_url"] = self.config.base_url
            body["id"] = self.config.base_url + "/id/00D000000000001/" + grant.client_id
        return body

    def revoke_grant(self, grant):
        if not grant.revoked:
            grant.revoked = True
            self.revoked_grants += 1
        for info in self.access.values():
            if info["grant"] is grant:
                info["revoked"] = True

    def access_live(self, token):
        info = self.access.get(token)
        return (info is not None and not info["revoked"] and not info["grant"].revoked
                and time.monotonic() < info["expires"])

    def snapshot(self):
        return {
            "token_requests": self.token_requests,
            "refresh_requests": self.refresh_requests,
            "client_credentials_requests": self.client_credentials_requests,
            "revoke_requests": self.revoke_requests,
            "revocations": list(self.revocations),
            "reused_refresh_tokens": self.reused_refresh_tokens,
            "revoked_grants": self.revoked_grants,
            "last_refresh_token_seen": mask(self.last_refresh_token_seen),
            "last_refresh_at_ms": self.last_refresh_at_ms,
            "refresh_before_expiry": self.refresh_before_expiry,
            "refresh_after_expiry": self.refresh_after_expiry,
            "injected_failures": self.injected_failures,
            "resource_ok": self.resource_ok,
            "resource_denied": self.resource_denied,
            "connections": self.connections,
            "tls_failures": self.tls_failures,
            "huge_bytes_sent": self.huge_bytes_sent,
            "mode": self.mode,
            "mode_remaining": self.mode_remaining,
            "down": self.down_until is not None,
            "held_answers": self.held_answers,
        }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "token_server/1"
    state = None  # set in main()

    # --- plumbing ---
    def setup(self):
        with self.state.lock:
            self.state.connections += 1
        super().setup()

    def handle(self):
        try:
            super().handle()
        except ssl.SSLError as e:
            # The client refused the certificate (or spoke no TLS).
            with self.state.lock:
                self.state.tls_failures += 1
            sys.stderr.write("token_server: TLS handshake failed: %s\n" % e)
        except (ConnectionResetError, BrokenPipeError):
            pass

    def log_request(self, code="-", size="-"):
        pass  # one line per request is written by _finish_log instead

    def log_message(self, fmt, *args):
        sys.stderr.write("token_server: %s %s\n" % (self.client_address[0], fmt % args))
        sys.stderr.flush()

    def _start(self):
        self._t0 = time.monotonic()
        self._notes = []
        self._status = None
        self._path = self.path.split("?", 1)[0]

    def _finish_log(self):
        ms = (time.monotonic() - self._t0) * 1000
        notes = (" " + " ".join(self._notes)) if self._notes else ""
        self.log_message("%s %s -> %s %.1fms%s", self.command, self._path,
                         self._status if self._status is not None else "no-answer", ms, notes)

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status, body=b"", content_type="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self._status = status
        self.send_response(status)
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Pragma", "no-cache")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _oauth_error(self, status, error, description=None, headers=None):
        body = {"error": error}
        if description:
            body["error_description"] = description
        self._notes.append("error=" + error)
        self._send(status, body, headers=headers)

    def _form(self, raw):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            return None
        parsed = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in parsed.items()}

    def _client_auth(self, form):
        """(client_id, client_secret) from HTTP Basic or the form."""
        auth = self.headers.get("Authorization") or ""
        if auth[:6].lower() == "basic ":
            try:
                decoded = base64.b64decode(auth[6:].strip()).decode()
                cid, _, secret = decoded.partition(":")
                return unquote_plus(cid), unquote_plus(secret)
            except Exception:
                return None, None
        return form.get("client_id"), form.get("client_secret")

    def _inject(self, mode):
        """Answers with an injected failure."""
        st = self.state
        self._notes.append("injected=" + mode)
        if mode == "error500":
            self._send(500, {"error": "server_error", "error_description": "injected failure"})
        elif mode == "error429":
            self._send(429, {"error": "rate_limited", "error_description": "injected failure"},
                       headers=None if st.retry_after is None else {"Retry-After": str(st.retry_after)})
        elif mode == "garbage":
            self._send(200, b"<html>oops", content_type="text/html")
        elif mode == "invalid_grant":
            self._send(400, {"error": "invalid_grant"})
        elif mode == "hang":
            self._hang(st.hang_seconds)
        elif mode == "close":
            self.close_connection = True
        elif mode == "reset":
            # SO_LINGER 0: close() sends a RST instead of a FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        elif mode == "truncated":
            self._status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "400")
            self.end_headers()
            self.wfile.write(b'{"access_token": "at_truncat')
            self.wfile.flush()
            self.close_connection = True
        elif mode in ("huge", "huge_unannounced"):
            self._huge(st.body_bytes, announce=mode == "huge")

    def _huge(self, size, announce):
        """A 200 answer of `size` bytes, sent until done or the client goes."""
        self._status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if announce:
            self.send_header("Content-Length", str(size))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        chunk = b'{"access_token": "' + b"x" * 65536
        sent = 0
        try:
            while sent < size:
                n = self.connection.send(chunk[:min(len(chunk), size - sent)])
                sent += n
        except OSError:
            self._notes.append("client-gave-up")
        with self.state.lock:
            self.state.huge_bytes_sent += sent
        self._notes.append("sent=%d" % sent)
        self.close_connection = True

    def _hang(self, seconds):
        """Never answers: waits until the client closes or `seconds` pass, then closes."""
        sock = self.connection
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            readable, _, _ = select.select([sock], [], [], min(0.2, remaining))
            if readable:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        self._notes.append("client-gave-up")
                        break
                except OSError:
                    break
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        self.close_connection = True

    # --- dispatch ---
    def do_GET(self):
        self._start()
        try:
            if self._path == "/resource":
                self._resource()
            elif self._path == "/control/stats":
                if self._control_allowed():
                    with self.state.lock:
                        snap = self.state.snapshot()
                    self._send(200, snap)
            elif self._path in ("/token", "/revoke", "/control/mode", "/control/reset", "/control/release"):
                self._send(405, {"error": "method_not_allowed"}, headers={"Allow": "POST"})
            else:
                self._send(404, {"error": "not_found"})
        finally:
            self._finish_log()

    def do_POST(self):
        self._start()
        try:
            raw = self._read_body()
            if self._path == "/token":
                self._token(raw)
            elif self._path == "/revoke":
                self._revoke(raw)
            elif self._path == "/control/mode":
                if self._control_allowed():
                    self._control_mode(raw)
            elif self._path == "/control/reset":
                if self._control_allowed():
                    with self.state.lock:
                        self.state.reset_counters()
                    self._send(200, {"ok": True})
            elif self._path == "/control/release":
                if self._control_allowed():
                    with self.state.lock:
                        released, self.state.release = self.state.release, threading.Event()
                        waiting = self.state.held_answers
                    released.set()
                    self._send(200, {"released": waiting})
            elif self._path == "/resource":
                self._send(405, {"error": "method_not_allowed"}, headers={"Allow": "GET"})
            else:
                self._send(404, {"error": "not_found"})
        finally:
            self._finish_log()

    def _control_allowed(self):
        if self.client_address[0] in ("127.0.0.1", "::1"):
            return True
        self._send(403, {"error": "forbidden"})
        return False

    # --- endpoints ---
    def _token(self, raw):
        st = self.state
        cfg = st.config
        form = self._form(raw) or {}
        grant_type = form.get("grant_type")
        with st.lock:
            st.token_requests += 1
            if grant_type == "refresh_token":
                st.refresh_requests += 1
                if form.get("refresh_token"):
                    st.last_refresh_token_seen = form["refresh_token"]
            elif grant_type == "client_credentials":
                st.client_credentials_requests += 1
            failure = st.take_failure("token")
        self._notes.append("grant_type=%s" % grant_type)
        if form.get("refresh_token"):
            self._notes.append("refresh_token=" + mask(form["refresh_token"]))
        slow = failure in ("slow", "held")
        if failure and not slow:
            self._inject(failure)
            return
        if self._form(raw) is None:
            self._oauth_error(400, "invalid_request", "expected application/x-www-form-urlencoded")
            return
        client_id, client_secret = self._client_auth(form)
        if not client_id:
            self._oauth_error(400, "invalid_request", "client_id missing")
            return
        if cfg.client_id is not None and client_id != cfg.client_id:
            self._oauth_error(401, "invalid_client", "unknown client")
            return
        if cfg.client_secret is not None and client_secret != cfg.client_secret:
            # RFC 6749 5.2: WWW-Authenticate only when the client authenticated
            # with the Authorization header; credentials in the body get none.
            basic = (self.headers.get("Authorization") or "").lower().startswith("basic ")
            self._oauth_error(401, "invalid_client", "bad client secret",
                              headers={"WWW-Authenticate": 'Basic realm="token_server"'} if basic else None)
            return
        if grant_type == "client_credentials":
            with st.lock:
                grant = Grant(secrets.token_hex(8), client_id, form.get("scope"))
                st.grants[grant.grant_id] = grant
                body = st.issue(grant, refresh_token=not cfg.no_client_refresh_token)
        elif grant_type == "refresh_token":
            rt = form.get("refresh_token")
            if not rt:
                self._oauth_error(400, "invalid_request", "refresh_token missing")
                return
            with st.lock:
                info = st.refresh.get(rt)
                if info is None:
                    err = "unknown refresh token"
                elif info["state"] == "used":
                    st.reused_refresh_tokens += 1
                    st.revoke_grant(info["grant"])
                    err = "refresh token reused"
                elif info["grant"].revoked:
                    err = "grant revoked"
                elif info["grant"].client_id != client_id:
                    err = "refresh token issued to another client"
                else:
                    err = None
                    grant = info["grant"]
                    st.last_refresh_at_ms = now_ms()
                    if st.access_live(grant.current_access):
                        st.refresh_before_expiry += 1
                    else:
                        st.refresh_after_expiry += 1
                    if form.get("scope"):
                        grant.scope = form["scope"]
                    body = st.issue(grant, rotate=not cfg.no_rotate)
            if err:
                if err == "refresh token reused":
                    self._notes.append("GRANT-REVOKED")
                if failure == "held":
                    self._hold_answer()
                self._oauth_error(400, "invalid_grant", err)
                return
        elif not grant_type:
            self._oauth_error(400, "invalid_request", "grant_type missing")
            return
        else:
            self._oauth_error(400, "unsupported_grant_type")
            return
        self._notes.append("-> access_token=" + mask(body["access_token"]))
        if "refresh_token" in body:
            self._notes.append("refresh_token=" + mask(body["refresh_token"]))
        if failure == "slow":
            # The tokens are issued; the client learns of them only later.
            self._notes.append("injected=slow")
            time.sleep(st.hang_seconds)
        elif failure == "held":
            # The tokens are issued; the client learns of them once released.
            self._hold_answer()
        self._send(200, body)

    def _hold_answer(self):
        """Waits for /control/release (at most hang_seconds) before the answer goes out."""
        st = self.state
        self._notes.append("injected=held")
        with st.lock:
            st.held_answers += 1
            release = st.release
        release.wait(st.hang_seconds)
        with st.lock:
            st.held_answers -= 1

    def _revoke(self, raw):
        st = self.state
        form = self._form(raw) or {}
        token = form.get("token") or ""
        hint = form.get("token_type_hint")
        with st.lock:
            st.revoke_requests += 1
            failure = st.take_failure("revoke")
            if not failure:
                kind = "unknown"
                if token in st.refresh:
                    kind = "refresh_token"
                    grant = st.refresh[token]["grant"]
                    st.refresh[token]["state"] = "used" if st.refresh[token]["state"] == "used" else "revoked"
                    st.revoke_grant(grant)
                elif token in st.access:
                    kind = "access_token"
                    st.access[token]["revoked"] = True
                st.revocations.append({"token": token[:6], "kind": kind, "hint": hint})
        self._notes.append("token=%s hint=%s" % (mask(token), hint))
        if failure:
            self._inject(failure)
            return
        self._send(200)

    def _resource(self):
        st = self.state
        auth = self.headers.get("Authorization") or ""
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        with st.lock:
            live = token is not None and st.access_live(token)
            if live:
                st.resource_ok += 1
            else:
                st.resource_denied += 1
        self._notes.append("access_token=%s" % mask(token))
        if live:
            self._send(200, {"ok": True})
        elif token is None:
            self._send(401, {"error": "invalid_request"}, headers={"WWW-Authenticate": "Bearer"})
        else:
            self._send(401, {"error": "invalid_token"},
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    def _control_mode(self, raw):
        st = self.state
        try:
            req = json.loads(raw or b"{}")
            mode = req.get("mode", "normal")
            count = req.get("count")
            retry_after = req.get("retry_after", 1)
            hang_seconds = float(req.get("hang_seconds", 60))
            target = req.get("target", "token")
            body_bytes = req.get("body_bytes", 8 << 20)
            if not isinstance(body_bytes, int) or not 0 <= body_bytes <= 1 << 30:
                raise ValueError("body_bytes must be an integer in 0...2^30")
            if mode not in MODES or target not in TARGETS:
                raise ValueError("mode must be one of %s, target one of %s" % (MODES, TARGETS))
            if mode in ("slow", "held") and target != "token":
                raise ValueError(mode + " is for the token endpoint only")
            if count is not None and (not isinstance(count, int) or count < 0):
                raise ValueError("count must be a non-negative integer or null")
            if retry_after is not None and (not isinstance(retry_after, int) or retry_after < 0):
                raise ValueError("retry_after must be a non-negative integer or null")
            if not 0 <= hang_seconds <= 600:
                raise ValueError("hang_seconds must be in 0...600")
        except (ValueError, AttributeError, TypeError) as e:
            self._send(400, {"error": "bad_control_request", "error_description": str(e)})
            return
        with st.lock:
            if mode == "down":
                # The serving loop closes the listener once this answer is out.
                st.down_until = time.monotonic() + hang_seconds
            elif mode == "normal" or count == 0:
                st.mode, st.mode_remaining = "normal", None
            else:
                st.mode, st.mode_remaining = mode, count
            st.body_bytes = body_bytes
            st.retry_after = retry_after
            st.hang_seconds = hang_seconds
            st.target = target
            answer = {"mode": st.mode, "remaining": st.mode_remaining,
                      "retry_after": st.retry_after, "target": st.target}
        self._notes.append("mode=%s count=%s target=%s" % (mode, count, target))
        self._send(200, answer)


def main():
    parser = argparse.ArgumentParser(description="OAuth2 token server for vaultd's tests (loopback only)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--lifetime", type=float, default=5.0, help="access token lifetime in seconds (default 5)")
    parser.add_argument("--client-id", default=None, help="if given, the only client_id accepted")
    parser.add_argument("--client-secret", default=None, help="if given, client_secret must equal it")
    parser.add_argument("--omit-expires-in", action="store_true", help="leave expires_in out of token responses")
    parser.add_argument("--salesforce", action="store_true", help="add issued_at (ms, string), instance_url and id")
    parser.add_argument("--no-rotate", action="store_true",
                        help="refresh responses carry no refresh_token; the old one stays valid")
    parser.add_argument("--no-client-refresh-token", action="store_true",
                        help="client credentials responses carry no refresh_token (RFC 6749 4.4.3)")
    parser.add_argument("--id-token", default=None, metavar="CLAIMS",
                        help="add an unsigned OpenID Connect id_token with these claims (a JSON object)")
    parser.add_argument("--tls-cert", default=None, help="serve TLS with this PEM certificate")
    parser.add_argument("--tls-key", default=None, help="the private key of --tls-cert (PEM)")
    config = parser.parse_args()

    tls = None
    if config.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(config.tls_cert, config.tls_key)

    def listener(sock):
        # The handshake runs in the request's thread, where a refused certificate is counted.
        return tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False) if tls else sock

    server = ThreadingHTTPServer(("127.0.0.1", config.port), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    server.socket = listener(server.socket)
    port = server.server_address[1]
    config.base_url = "%s://127.0.0.1:%d" % ("https" if tls else "http", port)
    state = State(config)
    Handler.state = state

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write("LISTENING %s\n" % config.base_url)
    sys.stdout.flush()
    server.timeout = 0.1
    listening = True
    try:
        while True:
            with state.lock:
                down_until = state.down_until
            if down_until is not None and time.monotonic() < down_until:
                if listening:
                    server.socket.close()   # connections are refused from now on
                    listening = False
                time.sleep(0.02)
                continue
            if not listening:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen(128)
                server.socket = listener(sock)
                listening = True
            if down_until is not None:
                with state.lock:
                    state.down_until = None
            server.handle_request()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
