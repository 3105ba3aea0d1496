#!/usr/bin/env python3
"""Stand-ins for the CometChat and OpenIM server REST APIs, for vaultd's tests
of the exec helpers in config/examples/ (issue 3). Stdlib only.

Run:  python3 chat_standins.py --port 0 [--openim-lifetime 5]
          [--openim-admin-lifetime 86400]
Binds 127.0.0.1 only, prints one line `LISTENING http://127.0.0.1:PORT` to
stdout (flushed), then serves until SIGTERM/SIGINT (exit status 0). One log
line per request goes to stderr; tokens are only ever shown as their first 6
characters and an ellipsis, the api key and the secret never.

Point the helpers at it with
  cometchat.json: {"base_url": "http://127.0.0.1:PORT/cometchat/v3", "api_key": "test-api-key"}
  openim.json:    {"api_url": "http://127.0.0.1:PORT/openim", "admin_user_id": "imAdmin",
                   "secret": "openIM123", "platform_id": 5}

CometChat (REST API v3, https://APPID.api-REGION.cometchat.io/v3), under /cometchat/v3
  Every request needs the header `apikey: test-api-key`: missing -> 401
  AUTH_ERR_EMPTY_APIKEY, wrong -> 401 AUTH_ERR_APIKEY_NOT_FOUND.
  Users: alice, bob (active), carol (deactivated). Any other UID -> 404
  ERR_UID_NOT_FOUND. Errors look like CometChat's:
      {"error": {"message": ..., "devMessage": ..., "source": "stand-in", "code": CODE}}
  POST   /users/{uid}/auth_tokens          body {} or {"force": true}. Without
         force the user's newest live token is returned when there is one (as
         CometChat does); with force, or when there is none, a new one
         `cc_<uid>_<n>` is made. -> 200 {"data": {"uid", "authToken", "createdAt"}}.
         carol -> 403 ERR_USER_DEACTIVATED (the code, not the status, says why).
  GET    /users/{uid}/auth_tokens          -> 200 {"data": [{"uid","authToken","createdAt"}...]}
  GET    /users/{uid}/auth_tokens/{token}  -> 200 {"data": {...}} or 404 AUTH_ERR_AUTH_TOKEN_NOT_FOUND
  DELETE /users/{uid}/auth_tokens/{token}  -> 200 {"data": {"success": true, "message": ...}}
         (the token stops working) or 404 AUTH_ERR_AUTH_TOKEN_NOT_FOUND.

OpenIM (server REST API, default http://IP:10002), under /openim
  Every request needs an `operationID` header (else errCode 1001, as OpenIM's
  gateway answers). HTTP status is 200 for every business answer; success and
  failure are in the body: {"errCode": 0|N, "errMsg": ..., "errDlt": ..., "data": ...}.
  POST /auth/get_admin_token   body {"secret": "openIM123", "userID": "imAdmin"}
       -> data {"token": "oiadm_<n>", "expireTimeSeconds": --openim-admin-lifetime}.
       Wrong secret -> 1002 NoPermissionError; another userID -> 1001 ArgsError.
  The calls below need the header `token: ADMIN_TOKEN`: missing or unknown ->
  1507 TokenNotExistError, expired -> 1501 TokenExpiredError, kicked -> 1506.
  POST /auth/get_user_token    body {"platformID": 1..9, "userID": UID}
       -> data {"token": "oi_<uid>_<n>", "expireTimeSeconds": --openim-lifetime}.
       Users alice, bob; another UID -> 1004 RecordNotFoundError; imAdmin ->
       1002; platformID not 1..9 -> 1001.
  POST /auth/force_logout      body {"platformID": P, "userID": UID}: every live
       user token of UID on platform P is kicked. Unknown UID -> 1004.
  POST /auth/parse_token       body {"token": USER_TOKEN} -> data {"userID",
       "platformID", "expireTimeSeconds": unix time of expiry}; expired ->
       1501, kicked -> 1506, unknown -> 1507.

Control (for the tests)
  GET  /control/stats   {"routes": {"METHOD /route/{with}/{placeholders}": count, ...},
                         "results": {"cometchat ERR_CODE"|"openim ERRCODE"|"... ok": count},
                         "cometchat": {...}, "openim": {...}, "failure": {...}}
  POST /control/reset   zeroes the counters (tokens, users and the failure mode are kept).
  POST /control/mode    JSON {"mode": normal|error500|hang|garbage|kick_admin_tokens,
                         "count": N (absent/null: until changed), "hang_seconds": 60,
                         "target": "cometchat"|"openim"|"both"}: the next N requests to
                         the target API fail that way. kick_admin_tokens (OpenIM only,
                         count defaults to 1): each of the next N OpenIM requests that
                         present an admin token first kicks every admin token issued so
                         far, so it is answered with errCode 1506.
  POST /control/user    JSON {"service": "cometchat"|"openim", "uid": UID,
                         "state": "active"|"deactivated"|"absent"} (deactivated: CometChat only).
"""

import argparse
import json
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMETCHAT_API_KEY = "test-api-key"
OPENIM_SECRET = "openIM123"
OPENIM_ADMIN = "imAdmin"
MODES = ("normal", "error500", "hang", "garbage", "kick_admin_tokens")
TARGETS = ("cometchat", "openim", "both")

# OpenIM's error codes (pkg/common/servererrs and tools/errs).
OI_ARGS = (1001, "ArgsError")
OI_NO_PERMISSION = (1002, "NoPermissionError")
OI_RECORD_NOT_FOUND = (1004, "RecordNotFoundError")
OI_TOKEN_EXPIRED = (1501, "TokenExpiredError")
OI_TOKEN_KICKED = (1506, "TokenKickedError")
OI_TOKEN_NOT_EXIST = (1507, "TokenNotExistError")


def mask(token):
    """First 6 characters and an ellipsis; never the whole token."""
    if token is None:
        return None
    return token[:6] + "…"


class State:
    def __init__(self, config):
        self.config = config
        self.lock = threading.Lock()
        self.serial = 0
        # CometChat: uid -> "active" | "deactivated"; token -> record.
        self.cc_users = {"alice": "active", "bob": "active", "carol": "deactivated"}
        self.cc_tokens = {}
        # OpenIM: set of users; admin tokens and user tokens -> record.
        self.oi_users = {"alice", "bob"}
        self.oi_admin_tokens = {}
        self.oi_user_tokens = {}
        self.mode = "normal"
        self.mode_remaining = None
        self.hang_seconds = 60.0
        self.target = "both"
        self.reset_counters()

    def reset_counters(self):
        self.routes = {}
        self.results = {}
        self.cc_created = 0
        self.cc_reused = 0
        self.cc_deleted = 0
        self.oi_admin_issued = 0
        self.oi_user_issued = 0
        self.oi_kicked = 0
        self.failures_injected = 0

    def next_serial(self):
        self.serial += 1
        return self.serial

    def take_failure(self, service, needs_admin=False):
        """The failure mode to apply to this request to `service`, or None.

        kick_admin_tokens is only taken by OpenIM requests that present an admin token."""
        with self.lock:
            if self.mode == "normal" or self.target not in (service, "both"):
                return None
            if self.mode == "kick_admin_tokens" and not needs_admin:
                return None
            mode = self.mode
            if self.mode_remaining is not None:
                self.mode_remaining -= 1
                if self.mode_remaining <= 0:
                    self.mode, self.mode_remaining = "normal", None
            self.failures_injected += 1
            return mode

    def count(self, route, result):
        with self.lock:
            self.routes[route] = self.routes.get(route, 0) + 1
            if result is not None:
                self.results[result] = self.results.get(result, 0) + 1

    def snapshot(self):
        now = time.time()
        with self.lock:
            return {
                "routes": dict(sorted(self.routes.items())),
                "results": dict(sorted(self.results.items())),
                "cometchat": {
                    "created": self.cc_created,
                    "reused": self.cc_reused,
                    "deleted": self.cc_deleted,
                    "live_tokens": sum(1 for t in self.cc_tokens.values() if t["live"]),
                    "users": dict(sorted(self.cc_users.items())),
                },
                "openim": {
                    "admin_tokens_issued": self.oi_admin_issued,
                    "user_tokens_issued": self.oi_user_issued,
                    "kicked": self.oi_kicked,
                    "live_user_tokens": sum(
                        1 for t in self.oi_user_tokens.values() if not t["kicked"] and t["expires"] > now
                    ),
                    "users": sorted(self.oi_users),
                    "user_lifetime": self.config.openim_lifetime,
                },
                "failure": {
                    "mode": self.mode,
                    "remaining": self.mode_remaining,
                    "target": self.target,
                    "injected": self.failures_injected,
                },
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "chat-standins/1"
    state = None  # set in main()

    # Logging: one line per request, written by _finish_log, never with secrets.
    def log_request(self, code="-", size="-"):
        pass

    def log_message(self, fmt, *args):
        sys.stderr.write("chat_standins: " + (fmt % args) + "\n")
        sys.stderr.flush()

    def _start(self):
        self._t0 = time.monotonic()
        self._route = "?"
        self._notes = []
        self._status = None

    def _finish_log(self):
        ms = (time.monotonic() - self._t0) * 1000.0
        note = (" " + " ".join(self._notes)) if self._notes else ""
        self.log_message("%s -> %s (%.1f ms)%s", self._route, self._status, ms, note)

    def _read_body(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if length < 0 or length > 1 << 20:
            length = 0
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw):
        if not raw.strip():
            return {}
        value = json.loads(raw.decode("utf-8"))
        if not isinstance(value, dict):
            raise ValueError("body must be a JSON object")
        return value

    def _send(self, status, body=b"", content_type="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode("utf-8")
        elif isinstance(body, str):
            body = body.encode("utf-8")
        self._status = status
        self.send_response(status)
        if body or status != 204:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _hang(self, seconds):
        """Hold the connection without answering; stop early if the client goes away."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                ready, _, _ = select.select([self.connection], [], [], min(left, 0.2))
                if ready and not self.connection.recv(1, socket.MSG_PEEK):
                    break  # the client closed the connection
            except (OSError, ValueError):
                break
        self.close_connection = True

    def _inject(self, service, mode):
        """Answer this request per the failure mode; True if it was answered."""
        self._notes.append("injected=%s" % mode)
        if mode == "error500":
            self._send(500, "<html><body>500 Internal Server Error (injected)</body></html>", "text/html")
        elif mode == "garbage":
            self._send(200, "this is { not json", "application/json")
        elif mode == "hang":
            self._status = "hang"
            self._hang(self.state.hang_seconds)
        elif mode == "kick_admin_tokens":
            st = self.state
            with st.lock:
                for record in st.oi_admin_tokens.values():
                    record["kicked"] = True
            return False  # the request itself is then handled normally
        return True

    # Dispatch -----------------------------------------------------------------

    def _dispatch(self):
        self._start()
        try:
            raw = self._read_body() if self.command in ("POST", "PUT", "DELETE") else b""
            path = urlsplit(self.path).path
            parts = [unquote(p) for p in path.split("/") if p]
            if parts[:2] == ["cometchat", "v3"]:
                self._cometchat(parts[2:], raw)
            elif parts[:1] == ["openim"]:
                self._openim(parts[1:], raw)
            elif parts[:1] == ["control"]:
                self._control(parts[1:], raw)
            else:
                self._route = "%s (unknown)" % self.command
                self.state.count("%s (unknown)" % self.command, None)
                self._send(404, {"error": "not_found"})
        except (BrokenPipeError, ConnectionResetError):
            self._status = "client gone"
        finally:
            self._finish_log()

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch

    # CometChat ----------------------------------------------------------------

    def _cc_error(self, status, code, message):
        self._notes.append(code)
        self.state.count(self._route, "cometchat " + code)
        self._send(status, {"error": {"message": message, "devMessage": message, "source": "stand-in", "code": code}})

    def _cc_ok(self, data):
        self.state.count(self._route, "cometchat ok")
        self._send(200, {"data": data})

    def _cometchat(self, parts, raw):
        st = self.state
        route_parts = ["cometchat", "v3"]
        # Route template for the stats: users/{uid}/auth_tokens[/{authToken}]
        if len(parts) >= 3 and parts[0] == "users" and parts[2] == "auth_tokens" and len(parts) <= 4:
            route_parts += ["users", "{uid}", "auth_tokens"] + (["{authToken}"] if len(parts) == 4 else [])
        else:
            route_parts += ["(unknown)"]
        self._route = "%s /%s" % (self.command, "/".join(route_parts))
        mode = st.take_failure("cometchat")
        if mode and self._inject("cometchat", mode):
            st.count(self._route, "cometchat injected " + mode)
            return

        key = self.headers.get("apikey")
        if not key:
            return self._cc_error(401, "AUTH_ERR_EMPTY_APIKEY", "The apikey header is missing from the request.")
        if key != COMETCHAT_API_KEY:
            return self._cc_error(401, "AUTH_ERR_APIKEY_NOT_FOUND", "The provided API key is invalid.")
        if route_parts[-1] == "(unknown)":
            return self._cc_error(404, "ERR_ROUTE_NOT_FOUND", "No such route in the CometChat stand-in.")

        uid = parts[1]
        self._notes.append("uid=%s" % uid)
        with st.lock:
            user_state = st.cc_users.get(uid)
        if user_state is None:
            return self._cc_error(
                404,
                "ERR_UID_NOT_FOUND",
                "The UID %s does not exist, please make sure you have created a user with UID %s." % (uid, uid),
            )

        if len(parts) == 3 and self.command == "POST":
            try:
                body = self._json_body(raw)
            except (ValueError, UnicodeDecodeError) as e:
                return self._cc_error(400, "ERR_BAD_REQUEST", "Malformed JSON body: %s" % e)
            force = body.get("force", False)
            if not isinstance(force, bool):
                return self._cc_error(400, "ERR_BAD_REQUEST", "The force field must be a boolean.")
            if user_state == "deactivated":
                return self._cc_error(403, "ERR_USER_DEACTIVATED", "The user with UID %s is deactivated." % uid)
            with st.lock:
                record = None
                if not force:
                    live = [t for t in st.cc_tokens.values() if t["uid"] == uid and t["live"]]
                    if live:
                        record = max(live, key=lambda t: t["serial"])
                        st.cc_reused += 1
                if record is None:
                    serial = st.next_serial()
                    token = "cc_%s_%d" % (uid, serial)
                    record = {"uid": uid, "authToken": token, "createdAt": int(time.time()), "serial": serial,
                              "live": True}
                    st.cc_tokens[token] = record
                    st.cc_created += 1
                data = {"uid": uid, "authToken": record["authToken"], "createdAt": record["createdAt"]}
            self._notes.append("force=%s token=%s" % (force, mask(data["authToken"])))
            return self._cc_ok(data)

        if len(parts) == 3 and self.command == "GET":
            with st.lock:
                data = [{"uid": t["uid"], "authToken": t["authToken"], "createdAt": t["createdAt"]}
                        for t in sorted(st.cc_tokens.values(), key=lambda t: t["serial"])
                        if t["uid"] == uid and t["live"]]
            return self._cc_ok(data)

        if len(parts) == 4 and self.command in ("GET", "DELETE"):
            token = parts[3]
            self._notes.append("token=%s" % mask(token))
            with st.lock:
                record = st.cc_tokens.get(token)
                found = record is not None and record["live"] and record["uid"] == uid
                if found and self.command == "DELETE":
                    record["live"] = False
                    st.cc_deleted += 1
                data = {"uid": uid, "authToken": token, "createdAt": record["createdAt"]} if found else None
            if not found:
                return self._cc_error(
                    404, "AUTH_ERR_AUTH_TOKEN_NOT_FOUND", "The auth token does not exist for the UID %s." % uid
                )
            if self.command == "DELETE":
                return self._cc_ok({"success": True, "message": "Auth token deleted successfully."})
            return self._cc_ok(data)

        return self._cc_error(405, "ERR_METHOD_NOT_ALLOWED", "Method %s is not allowed here." % self.command)

    # OpenIM -------------------------------------------------------------------

    def _oi_answer(self, err, msg="", data=None):
        code, name = err if err else (0, "")
        body = {"errCode": code, "errMsg": name if code else "", "errDlt": (": [%d]%s %s" % (code, name, msg)).strip()
                if code else ""}
        if data is not None:
            body["data"] = data
        if code:
            self._notes.append("errCode=%d" % code)
        self.state.count(self._route, "openim %s" % (code if code else "ok"))
        self._send(200, body)

    def _oi_check_admin(self):
        """The error of the request's admin token, or None when it is live."""
        st = self.state
        token = self.headers.get("token")
        if not token:
            return OI_TOKEN_NOT_EXIST, "token is empty"
        with st.lock:
            record = st.oi_admin_tokens.get(token)
        if record is None:
            return OI_TOKEN_NOT_EXIST, "admin token not found"
        if record["kicked"]:
            return OI_TOKEN_KICKED, "admin token kicked"
        if record["expires"] <= time.time():
            return OI_TOKEN_EXPIRED, "admin token expired"
        return None

    def _openim(self, parts, raw):
        st = self.state
        known = ("get_admin_token", "get_user_token", "force_logout", "parse_token")
        if len(parts) == 2 and parts[0] == "auth" and parts[1] in known:
            self._route = "%s /openim/auth/%s" % (self.command, parts[1])
        else:
            self._route = "%s /openim/(unknown)" % self.command
            st.count(self._route, None)
            return self._send(404, "404 page not found", "text/plain")
        if self.command != "POST":
            st.count(self._route, None)
            return self._send(404, "404 page not found", "text/plain")
        mode = st.take_failure("openim", needs_admin=parts[1] != "get_admin_token")
        if mode and self._inject("openim", mode):
            st.count(self._route, "openim injected " + mode)
            return
        if not self.headers.get("operationID"):
            return self._oi_answer(OI_ARGS, "header must have operationID")
        try:
            body = self._json_body(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return self._oi_answer(OI_ARGS, "malformed JSON body: %s" % e)
        now = time.time()
        action = parts[1]

        if action == "get_admin_token":
            if body.get("secret") != OPENIM_SECRET:
                return self._oi_answer(OI_NO_PERMISSION, "secret invalid")
            if body.get("userID") != OPENIM_ADMIN:
                return self._oi_answer(OI_ARGS, "userID is error")
            lifetime = st.config.openim_admin_lifetime
            with st.lock:
                token = "oiadm_%d" % st.next_serial()
                st.oi_admin_tokens[token] = {"expires": now + lifetime, "kicked": False}
                st.oi_admin_issued += 1
            self._notes.append("admin token=%s" % mask(token))
            return self._oi_answer(None, data={"token": token, "expireTimeSeconds": int(lifetime)})

        failure = self._oi_check_admin()
        if failure:
            return self._oi_answer(*failure)

        if action in ("get_user_token", "force_logout"):
            uid = body.get("userID")
            platform = body.get("platformID")
            self._notes.append("uid=%s platform=%s" % (uid, platform))
            if not isinstance(uid, str) or not uid:
                return self._oi_answer(OI_ARGS, "userID is empty")
            if not isinstance(platform, int) or isinstance(platform, bool) or not 1 <= platform <= 9:
                return self._oi_answer(OI_ARGS, "platformID must be 1..9")
            if uid == OPENIM_ADMIN:
                return self._oi_answer(OI_NO_PERMISSION, "don't get Admin token")
            with st.lock:
                exists = uid in st.oi_users
            if not exists:
                return self._oi_answer(OI_RECORD_NOT_FOUND, "user %s not found" % uid)
            if action == "get_user_token":
                lifetime = st.config.openim_lifetime
                with st.lock:
                    token = "oi_%s_%d" % (uid, st.next_serial())
                    st.oi_user_tokens[token] = {"uid": uid, "platform": platform, "expires": now + lifetime,
                                                "kicked": False}
                    st.oi_user_issued += 1
                self._notes.append("token=%s" % mask(token))
                return self._oi_answer(None, data={"token": token, "expireTimeSeconds": int(lifetime)})
            kicked = 0
            with st.lock:
                for record in st.oi_user_tokens.values():
                    if record["uid"] == uid and record["platform"] == platform and not record["kicked"]:
                        record["kicked"] = True
                        kicked += 1
                st.oi_kicked += kicked
            self._notes.append("kicked=%d" % kicked)
            return self._oi_answer(None)

        # parse_token
        token = body.get("token")
        with st.lock:
            record = st.oi_user_tokens.get(token) if isinstance(token, str) else None
            record = dict(record) if record else None
        if record is None:
            return self._oi_answer(OI_TOKEN_NOT_EXIST, "token not found")
        if record["kicked"]:
            return self._oi_answer(OI_TOKEN_KICKED, "token kicked")
        if record["expires"] <= now:
            return self._oi_answer(OI_TOKEN_EXPIRED, "token expired")
        return self._oi_answer(None, data={"userID": record["uid"], "platformID": record["platform"],
                                           "expireTimeSeconds": int(record["expires"])})

    # Control ------------------------------------------------------------------

    def _control(self, parts, raw):
        st = self.state
        name = "/".join(parts)
        self._route = "%s /control/%s" % (self.command, name)
        if self.command == "GET" and name == "stats":
            return self._send(200, st.snapshot())
        if self.command != "POST" or name not in ("reset", "mode", "user"):
            return self._send(404, {"error": "not_found"})
        if name == "reset":
            with st.lock:
                st.reset_counters()
            return self._send(200, {"reset": True})
        try:
            req = self._json_body(raw)
            if name == "mode":
                mode = req.get("mode", "normal")
                count = req.get("count")
                target = req.get("target", "both")
                hang_seconds = float(req.get("hang_seconds", 60))
                if mode not in MODES or target not in TARGETS:
                    raise ValueError("mode must be one of %s, target one of %s" % (MODES, TARGETS))
                if count is not None and (not isinstance(count, int) or count < 0):
                    raise ValueError("count must be a non-negative integer or null")
                if mode == "kick_admin_tokens" and count is None:
                    count = 1
                if not 0 <= hang_seconds <= 600:
                    raise ValueError("hang_seconds must be in 0...600")
            else:
                service, uid, state = req.get("service"), req.get("uid"), req.get("state")
                if service not in ("cometchat", "openim") or not isinstance(uid, str) or not uid:
                    raise ValueError("service must be cometchat or openim, uid a non-empty string")
                allowed = ("active", "deactivated", "absent") if service == "cometchat" else ("active", "absent")
                if state not in allowed:
                    raise ValueError("state must be one of %s" % (allowed,))
        except (ValueError, AttributeError, TypeError, UnicodeDecodeError) as e:
            return self._send(400, {"error": "bad_control_request", "error_description": str(e)})
        with st.lock:
            if name == "mode":
                if mode == "normal" or count == 0:
                    st.mode, st.mode_remaining = "normal", None
                else:
                    st.mode, st.mode_remaining = mode, count
                st.hang_seconds = hang_seconds
                st.target = target
                answer = {"mode": st.mode, "remaining": st.mode_remaining, "target": st.target}
            elif service == "cometchat":
                if state == "absent":
                    st.cc_users.pop(uid, None)
                else:
                    st.cc_users[uid] = state
                answer = {"users": dict(sorted(st.cc_users.items()))}
            else:
                if state == "absent":
                    st.oi_users.discard(uid)
                else:
                    st.oi_users.add(uid)
                answer = {"users": sorted(st.oi_users)}
        self._notes.append(json.dumps(req, sort_keys=True))
        return self._send(200, answer)


def main():
    parser = argparse.ArgumentParser(description="CometChat and OpenIM REST API stand-ins for vaultd's tests")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1; 0 picks a free one")
    parser.add_argument("--openim-lifetime", type=float, default=5.0,
                        help="OpenIM user token lifetime in seconds (expireTimeSeconds; default 5)")
    parser.add_argument("--openim-admin-lifetime", type=float, default=86400.0,
                        help="OpenIM admin token lifetime in seconds (default 86400)")
    config = parser.parse_args()
    if config.openim_lifetime <= 0 or config.openim_admin_lifetime <= 0:
        parser.error("lifetimes must be positive")

    server = ThreadingHTTPServer(("127.0.0.1", config.port), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    port = server.server_address[1]
    Handler.state = State(config)

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write("LISTENING http://127.0.0.1:%d\n" % port)
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
