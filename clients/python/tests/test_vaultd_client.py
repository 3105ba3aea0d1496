"""Tests of vaultd_client: standard library only (python3 -m unittest).

The offline tests run anywhere. LiveTests talk to a real vaultd and a real
OAuth 2.0 token server (Tests/servers/token_server.py); they run when
VAULTD_CLIENT_TEST_SOCKET names the daemon's socket and
VAULTD_CLIENT_TEST_TOKEN_SERVER the token server's URL, as the Swift suite
PythonClientTests sets them (its daemon has the providers oauth, demo (static)
and spare (oauth2)); otherwise they are skipped.
"""

import dataclasses
import inspect
import os
import re
import select
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request
import uuid
from unittest import mock

import vaultd_client
from vaultd_client import (
    Client,
    Event,
    LoginResult,
    ReconnectPolicy,
    Session,
    SessionPage,
    Token,
    VaultdConnectionError,
    VaultdError,
    VaultdTimeoutError,
)

HERE = os.path.dirname(os.path.abspath(__file__))
IDL_PATH = os.environ.get(
    "VAULTD_CLIENT_TEST_IDL", os.path.join(HERE, "..", "..", "..", "docs", "io.vaultd.Vault.varlink")
)

# How each method's output fields are held in Python: the result class and
# the wire fields it renames. A method with output that is missing here fails
# test_every_output_field_is_read.
OUTPUTS = {
    "Login": (LoginResult, {}),
    "GetSession": (None, {"session": "the returned Session"}),
    "Refresh": (None, {"session": "the returned Session"}),
    "ListSessions": (SessionPage, {}),
    "GetToken": (Token, {"token": "value"}),
    "Subscribe": (vaultd_client.EventStream, {"sessions": "snapshot", "event": "__next__"}),
    "ReportRejected": (None, {"outcome": "the returned string"}),
    "StartDeviceLogin": (vaultd_client.DeviceLoginStart, {}),
    "PollDeviceLogin": (vaultd_client.DeviceLoginPoll, {}),
    "BeginBrowserLogin": (vaultd_client.BrowserLoginStart, {}),
    "FinishBrowserLogin": (LoginResult, {}),
}


def parse_idl(text):
    """The methods (name -> (parameters, outputs)) and struct types
    (name -> fields) of a Varlink interface text, field names only."""
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())

    def names(fields):
        out = []
        for item in fields.split(","):
            item = item.strip()
            if item:
                name = item.split(":", 1)[0].strip()
                assert re.fullmatch(r"\w+", name), "cannot read the field %r" % item
                out.append(name)
        return out

    methods = {
        m.group(1): (names(m.group(2)), names(m.group(3)))
        for m in re.finditer(r"\bmethod\s+(\w+)\s*\(([^()]*)\)\s*->\s*\(([^()]*)\)", body)
    }
    types = {
        m.group(1): names(m.group(2))
        for m in re.finditer(r"\btype\s+(\w+)\s*\(([^()]*)\)", body)
        if ":" in m.group(2)  # structs; enums have no field types
    }
    errors = re.findall(r"\berror\s+(\w+)\s*\(", body)
    return methods, types, errors


def wire_fields(cls):
    """The wire names of a result dataclass's fields."""
    out = set()
    for f in dataclasses.fields(cls):
        wire = f.metadata.get("wire", vaultd_client._camel(f.name))
        if wire is not None:
            out.add(wire)
    return out


def missing_from_client(text):
    """What of the interface text the client lacks: one line per method,
    parameter or type field it does not cover."""
    methods, types, errors = parse_idl(text)
    missing = []
    if not methods:
        missing.append("no method found in the interface text")
    for name, (parameters, _) in sorted(methods.items()):
        call = getattr(Client, vaultd_client._snake(name), None)
        if not callable(call):
            missing.append("method %s: no Client.%s" % (name, vaultd_client._snake(name)))
            continue
        accepted = inspect.signature(call).parameters
        for parameter in parameters:
            if vaultd_client._snake(parameter) not in accepted:
                missing.append("method %s: no keyword %s" % (name, vaultd_client._snake(parameter)))
    for name, fields in sorted(types.items()):
        cls = getattr(vaultd_client, name, None)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            missing.append("type %s: no dataclass vaultd_client.%s" % (name, name))
            continue
        for f in sorted(set(fields) - wire_fields(cls)):
            missing.append("type %s: no field for %s" % (name, f))
    for name in errors:
        cls = getattr(vaultd_client, name, None)
        if not (isinstance(cls, type) and issubclass(cls, VaultdError) and cls is not VaultdError):
            missing.append("error %s: no exception class vaultd_client.%s" % (name, name))
    return missing


def read_idl():
    with open(IDL_PATH, encoding="utf-8") as f:
        return f.read()


class CompletenessTests(unittest.TestCase):
    """The client keeps up with the interface: a method, parameter or field
    added to io.vaultd.Vault fails here until the client has it."""

    def test_every_method_parameter_and_type_field_has_python(self):
        """Should find a Client call for every method, a keyword for every parameter, a field for every
        type field and an exception class for every error."""
        self.assertEqual(missing_from_client(read_idl()), [])

    def test_every_output_field_is_read(self):
        """Should read every output field of every method into its result."""
        methods, _, _ = parse_idl(read_idl())
        for name, (_, outputs) in sorted(methods.items()):
            if not outputs:
                continue
            self.assertIn(name, OUTPUTS, "method %s has output %s: say in OUTPUTS how it is returned" % (name, outputs))
            cls, renamed = OUTPUTS[name]
            known = set(renamed)
            if cls is not None and dataclasses.is_dataclass(cls):
                known |= wire_fields(cls)
            elif cls is vaultd_client.EventStream:
                known |= {"store"}
            self.assertEqual(sorted(set(outputs) - known), [], "output of %s not read" % name)

    def test_a_missing_method_is_caught(self):
        """Should report a method, a parameter and a type field the client does not have."""
        text = read_idl() + (
            "\nmethod FrobnicateToken(provider: string, level: ?int) -> ()\n"
            "\nmethod GetToken2(provider: string) -> ()\n"
            "\ntype Widget (name: string)\n"
            "\nerror Frobnicated (code: string, message: string)\n"
        )
        missing = missing_from_client(text)
        self.assertIn("method FrobnicateToken: no Client.frobnicate_token", missing)
        self.assertIn("method GetToken2: no Client.get_token2", missing)
        self.assertIn("type Widget: no dataclass vaultd_client.Widget", missing)
        self.assertIn("error Frobnicated: no exception class vaultd_client.Frobnicated", missing)
        self.assertEqual(len(missing), 4, missing)


SECRET = "sk_live_0123456789abcdefghijklmnopqrstuv"


class ErrorTests(unittest.TestCase):
    """Error replies become exceptions of their own class."""

    def test_error_classes(self):
        """Should raise the class of a known error name and VaultdError for any other, with code and message."""
        error = vaultd_client._error("io.vaultd.Vault.TokenExpired", {"code": "ERR_TOKEN_EXPIRED", "message": "m"})
        self.assertIsInstance(error, vaultd_client.TokenExpired)
        self.assertEqual((error.code, error.message, str(error)), ("ERR_TOKEN_EXPIRED", "m", "m (ERR_TOKEN_EXPIRED)"))
        self.assertIsNone(error.provider_code)
        refused = vaultd_client._error(
            "io.vaultd.Vault.InvalidClient",
            {"code": "ERR_INVALID_CLIENT", "message": "m", "providerCode": "AUTH_ERR_APIKEY_NOT_FOUND",
             "providerMessage": "API key not found"})
        self.assertIsInstance(refused, vaultd_client.InvalidClient)
        self.assertEqual(
            (refused.code, refused.provider_code, refused.provider_message, str(refused)),
            ("ERR_INVALID_CLIENT", "AUTH_ERR_APIKEY_NOT_FOUND", "API key not found",
             "m (ERR_INVALID_CLIENT; provider: AUTH_ERR_APIKEY_NOT_FOUND)"))
        later = vaultd_client._error("io.vaultd.Vault.SomethingNew", {"code": "ERR_NEW", "message": "m"})
        self.assertIs(type(later), VaultdError)
        varlink = vaultd_client._error("org.varlink.service.InvalidParameter", {"parameter": "limit"})
        self.assertIs(type(varlink), VaultdError)
        self.assertEqual((varlink.code, varlink.message), (None, "invalid parameter 'limit'"))


class MaskTests(unittest.TestCase):
    """Secrets show at most four characters."""

    def test_mask_as_vaultd(self):
        """Should mask as vaultd does: 2+2 from 16 characters, 1+1 from 8, stars only below."""
        self.assertEqual(vaultd_client.mask(SECRET), "sk********uv")
        self.assertEqual(vaultd_client.mask("abcdefgh"), "a********h")
        self.assertEqual(vaultd_client.mask("abcdefg"), "********")
        self.assertEqual(vaultd_client.mask(""), "********")

    def test_token_repr_and_str_are_masked(self):
        """Should never show a Token's value in repr(), str() or a format string."""
        token = Token(value=SECRET, token_type="Bearer", expires_at=1, owner_uid=1000, scope="api")
        for text in (repr(token), str(token), "%s" % (token,), "{}".format(token), repr([token])):
            self.assertNotIn(SECRET, text)
            self.assertIn("sk********uv", text)
            self.assertIn("scope='api'", text)
        self.assertEqual(token.value, SECRET)

    def test_session_remasks_what_is_not_masked(self):
        """Should mask a session's token again if a vaultd ever sent more than a mask."""
        session = Session.from_json(
            {"provider": "p", "user": "u", "state": "logged", "hasRefreshToken": False, "token": SECRET}
        )
        self.assertNotIn(SECRET, repr(session))
        self.assertEqual(session.masked_token, "sk********uv")
        masked = Session.from_json(
            {"provider": "p", "user": "u", "state": "logged", "hasRefreshToken": False, "token": "ab********yz"}
        )
        self.assertEqual(masked.masked_token, "ab********yz")


class OfflineConnectionTests(unittest.TestCase):
    """Connection problems are their own exception and say what to do."""

    def test_default_socket_path(self):
        """Should find the socket as vaultctl does."""
        path = vaultd_client.default_socket_path
        self.assertEqual(path({"VAULTD_SOCKET": "/x/s", "XDG_RUNTIME_DIR": "/run/user/7"}, 7), "/x/s")
        self.assertEqual(path({"VAULTD_SOCKET": "", "XDG_RUNTIME_DIR": "/run/user/7"}, 7), "/run/user/7/vaultd/socket")
        self.assertEqual(path({"XDG_RUNTIME_DIR": "relative"}, 7), "/run/user/7/vaultd/socket")
        self.assertEqual(path({}, 0), "/run/vaultd/socket")

    def test_unreachable_socket_says_what_to_do(self):
        """Should raise VaultdConnectionError naming the socket and asking whether vaultd runs."""
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "nothing.sock")
            with self.assertRaises(VaultdConnectionError) as caught:
                Client(path, timeout=5)
        self.assertNotIsInstance(caught.exception, VaultdError)
        self.assertEqual(caught.exception.socket_path, path)
        self.assertIn(path, str(caught.exception))
        self.assertIn("Is vaultd running?", str(caught.exception))

    def test_silent_server_times_out_and_breaks_the_connection(self):
        """Should raise VaultdTimeoutError when no reply comes in time, then refuse further calls."""
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "silent.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(path)
                listener.listen(1)
                client = Client(path, timeout=0.3)
                started = time.monotonic()
                with self.assertRaises(VaultdTimeoutError) as caught:
                    client.get_token("demo", "alice")
                self.assertLess(time.monotonic() - started, 10)
                self.assertIn("did not answer in time", str(caught.exception))
                with self.assertRaises(VaultdConnectionError) as again:
                    client.list_sessions()
                self.assertIn("earlier call on this connection", str(again.exception))
                client.close()
            finally:
                listener.close()


class UntrustedSocketTests(unittest.TestCase):
    """A socket served by another user gets nothing, as vaultctl refuses it."""

    def test_trusts_root_self_and_no_one_else(self):
        """Should trust a peer that is root or this process's user, and no other uid without a vaultd user."""
        trusts = vaultd_client._Connection.trusts
        self.assertTrue(trusts(0, 1000))
        self.assertTrue(trusts(1000, 1000))
        with mock.patch("pwd.getpwnam", side_effect=KeyError("vaultd")):
            self.assertFalse(trusts(1001, 1000))

    @unittest.skipUnless(os.geteuid() == 0, "needs root to serve a socket as another uid")
    def test_socket_served_by_another_uid_is_refused(self):
        """Should raise VaultdUntrustedSocketError, before sending anything, for a socket nobody (65534) serves."""
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "impostor.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            ready_r, ready_w = os.pipe()
            done_r, done_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the impostor: listens as nobody, so SO_PEERCRED names nobody
                try:
                    os.close(done_w)
                    os.close(ready_r)
                    os.setgid(65534)
                    os.setuid(65534)
                    listener.listen(1)
                    os.write(ready_w, b"r")
                    select.select([done_r], [], [], 60)  # until the parent is done (it closes done_w)
                finally:
                    os._exit(0)
            try:
                os.close(ready_w)
                self.assertEqual(select.select([ready_r], [], [], 30)[0], [ready_r], "the impostor did not start")
                self.assertEqual(os.read(ready_r, 1), b"r")
                with self.assertRaises(vaultd_client.VaultdUntrustedSocketError) as caught:
                    Client(path, timeout=5)
                self.assertEqual(caught.exception.peer_uid, 65534)
                self.assertIn("refusing to send credentials", str(caught.exception))
                # Nothing was sent: the connection waits in the backlog unread.
                listener.setblocking(False)
                accepted, _ = listener.accept()
                accepted.settimeout(5)
                self.assertEqual(accepted.recv(100), b"")
                accepted.close()
            finally:
                os.close(done_w)
                os.close(ready_r)
                os.close(done_r)
                os.waitpid(pid, 0)
                listener.close()


def _live():
    socket_path = os.environ.get("VAULTD_CLIENT_TEST_SOCKET")
    server = os.environ.get("VAULTD_CLIENT_TEST_TOKEN_SERVER")
    return socket_path, server


@unittest.skipUnless(
    all(_live()), "set VAULTD_CLIENT_TEST_SOCKET and VAULTD_CLIENT_TEST_TOKEN_SERVER (PythonClientTests does)"
)
class LiveTests(unittest.TestCase):
    """The client against a real vaultd and a real token server."""

    def setUp(self):
        self.socket_path, self.server = _live()
        self.vault = Client(self.socket_path, timeout=60)
        self.addCleanup(self.vault.close)

    def user(self, prefix):
        return "%s-%s" % (prefix, uuid.uuid4().hex[:8])

    def grant(self):
        """A fresh client_credentials grant of the scope 'api chat' from the token server, as its JSON text."""
        request = urllib.request.Request(
            self.server + "/token",
            data=b"grant_type=client_credentials&client_id=vaultd-test&scope=api+chat",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode("utf-8")

    def accepted(self, token):
        """True when the token server's protected resource takes ``token``."""
        request = urllib.request.Request(self.server + "/resource", headers={"Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    def wait_for(self, stream, kind, limit=50):
        """The next event of ``kind`` on ``stream``, skipping others: at most
        ``limit`` events, each read bounded by the stream's timeout."""
        seen = []
        for _ in range(limit):
            event = next(stream, None)
            if event is None:
                break
            if event.kind == kind:
                return event
            seen.append(event.kind)
        self.fail("no %s event (saw %s; stream end: %r)" % (kind, seen, stream.end))

    def test_oauth_session_lifecycle(self):
        """Should log in, show status, hand out and refresh the token, stream the events, and log out."""
        user = self.user("py-oauth")
        with self.vault.subscribe(provider="oauth", user=user, timeout=60) as events:
            self.assertEqual(events.snapshot, [])
            self.assertEqual(events.store, "available")

            login = self.vault.login("oauth", user, token_response=self.grant())
            self.assertIsInstance(login, LoginResult)
            self.assertTrue(login.created)
            self.assertEqual((login.session.provider, login.session.user), ("oauth", user))
            self.assertEqual(login.session.state, "logged")
            self.assertTrue(login.session.has_refresh_token)
            self.assertEqual(self.wait_for(events, "loginSuccess").user, user)

            status = self.vault.get_session("oauth", user)
            self.assertIsInstance(status, Session)
            self.assertEqual(status.owner_uid, os.geteuid())
            self.assertIsNotNone(status.expires_at)
            self.assertIn(user, [s.user for s in self.vault.all_sessions(page_size=1)])

            first = self.vault.get_token("oauth", user)
            self.assertEqual(first.owner_uid, os.geteuid())
            self.assertEqual(first.scope, "api chat")
            self.assertTrue(self.accepted(first.value))

            refreshed = self.vault.refresh("oauth", user)
            self.assertIsNotNone(refreshed.last_refresh_at)
            event = self.wait_for(events, "tokenRefreshed")
            self.assertIsInstance(event, Event)
            self.assertEqual((event.provider, event.user, event.owner_uid), ("oauth", user, os.geteuid()))
            second = self.vault.get_token("oauth", user, min_valid_seconds=60)
            self.assertNotEqual(first.value, second.value)
            self.assertTrue(self.accepted(second.value))

            # The chat server rejected the current token: vaultd refreshes once.
            self.assertEqual(self.vault.report_rejected("oauth", user, token=second.value), "refreshed")
            self.wait_for(events, "tokenRefreshed")
            self.assertEqual(self.vault.report_rejected("oauth", user, token=second.value), "alreadyReplaced")

            self.vault.set_connection_state("oauth", user, state="connected", client="py-test")
            clients = self.vault.get_session("oauth", user).clients
            self.assertEqual([(c.name, c.state, c.pid) for c in clients], [("py-test", "connected", os.getpid())])

            self.vault.logout("oauth", user)
            self.assertEqual(self.wait_for(events, "logoutSuccess").user, user)
        with self.assertRaises(VaultdError) as caught:
            self.vault.get_token("oauth", user)
        self.assertEqual(caught.exception.code, "ERR_NOT_LOGGED_IN")

    def test_token_of_a_user_not_logged_in_raises_with_code(self):
        """Should raise VaultdError with the Varlink name, the SDK code, a message and the parameters."""
        user = self.user("py-nobody")
        with self.assertRaises(VaultdError) as caught:
            self.vault.get_token("demo", user, wait_seconds=0)
        error = caught.exception
        self.assertIsInstance(error, vaultd_client.NotLoggedIn)
        self.assertEqual(error.name, "io.vaultd.Vault.NotLoggedIn")
        self.assertEqual(error.short_name, "NotLoggedIn")
        self.assertEqual(error.code, "ERR_NOT_LOGGED_IN")
        self.assertEqual(error.parameters["code"], "ERR_NOT_LOGGED_IN")
        self.assertTrue(error.message)
        self.assertIn("ERR_NOT_LOGGED_IN", str(error))
        # The connection goes on after an error reply.
        self.assertIsInstance(self.vault.list_sessions(), SessionPage)

    def test_tokens_are_masked_in_reprs_and_errors(self):
        """Should show at most four characters of a token in every result's repr() and in no error text."""
        user = self.user("py-mask")
        login = self.vault.login("demo", user, token=SECRET)
        token = self.vault.get_token("demo", user)
        self.assertEqual(token.value, SECRET)
        page = self.vault.list_sessions(limit=1000)
        texts = [repr(login), repr(token), str(token), repr(self.vault.get_session("demo", user)), repr(page)]
        for text in texts:
            self.assertNotIn(SECRET, text)
            self.assertNotIn(SECRET[2:-2], text)
        self.assertIn("sk********uv", repr(token))
        # Errors of calls that carried the token.
        for call in (
            lambda: self.vault.login("no-such-provider", user, token=SECRET),
            lambda: self.vault.login("demo", user + "-expired", token=SECRET, expires_at=5),
            lambda: self.vault.set_provider_secret("demo", secret=SECRET),
        ):
            with self.assertRaises(VaultdError) as caught:
                call()
            for text in (str(caught.exception), repr(caught.exception), repr(caught.exception.parameters)):
                self.assertNotIn(SECRET, text)
        self.vault.logout("demo", user)

    def test_force_logout_is_seen_by_a_narrowed_subscriber(self):
        """Should deliver kickedOffline, with its reason, to a stream narrowed to that kind."""
        user = self.user("py-kick")
        self.vault.login("demo", user, token=SECRET)
        with self.vault.subscribe(provider="demo", user=user, kinds=["kickedOffline"], timeout=60) as events:
            self.assertEqual([s.user for s in events.snapshot], [user])
            self.vault.force_logout("demo", user, reason="admin")
            event = next(events)
            self.assertEqual((event.kind, event.reason), ("kickedOffline", "admin"))
            self.assertIsNone(events.next_event(timeout=0.2))
            self.assertIsNone(events.end)

    def test_provider_secret_and_default_socket(self):
        """Should store a provider secret, and find vaultd through $VAULTD_SOCKET as vaultctl does."""
        self.assertIsNone(self.vault.set_provider_secret("spare", secret="spare-client-secret-value"))
        with mock.patch.dict(os.environ, {"VAULTD_SOCKET": self.socket_path}):
            with Client(timeout=30) as vault:
                self.assertEqual(vault.socket_path, self.socket_path)
                self.assertEqual(vault.list_sessions(limit=1).store, "available")

    def test_served_interface_is_covered(self):
        """Should cover the interface the running vaultd serves, not only the one in docs."""
        self.assertIn(vaultd_client.INTERFACE, self.vault.get_info()["interfaces"])
        self.assertEqual(missing_from_client(self.vault.get_interface_description()), [])


if __name__ == "__main__":
    unittest.main()


class ReconnectPolicyTests(unittest.TestCase):
    """The schedule of a reconnecting stream, without a vaultd."""

    def test_delays_double_up_to_the_cap(self):
        """Should wait 1 s, then twice as long each time, at most 30 s, by default."""
        policy = ReconnectPolicy()
        self.assertEqual([policy.delay(n) for n in (1, 2, 3, 5, 6, 100)], [1, 2, 4, 16, 30, 30])

    def test_only_errors_another_attempt_may_mend_are_retried(self):
        """Should retry an unreachable or stopping vaultd, and not a refusal or an untrusted socket."""
        worth = vaultd_client._worth_retrying
        self.assertTrue(worth(VaultdConnectionError("gone", "/s")))
        self.assertTrue(worth(vaultd_client._error("io.vaultd.Vault.InternalError", {"code": "ERR_INTERNAL"})))
        self.assertFalse(worth(vaultd_client._error("io.vaultd.Vault.AccessDenied", {"code": "ERR_ACCESS_DENIED"})))
        self.assertFalse(worth(vaultd_client.VaultdUntrustedSocketError("/s", 65534)))


class _Vaultd:
    """A vaultd of the test's own (``--memory-store``, one static provider
    ``demo``) on ``socket_path``, started and stopped by the test."""

    def __init__(self, binary, directory):
        self.binary = binary
        self.socket_path = os.path.join(directory, "vaultd.sock")
        self.config = os.path.join(directory, "vaultd.conf")
        with open(self.config, "w") as f:
            f.write("[Provider demo]\nType=static\n")
        self.process = None

    def start(self):
        """Starts vaultd and waits (at most 60 s) for its ready line."""
        self.process = subprocess.Popen(
            [self.binary, "--socket", self.socket_path, "--config", self.config, "--memory-store"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        seen = b""
        while b"ready" not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stderr], [], [], left)[0]:
                self.stop(signal.SIGKILL)
                raise AssertionError("vaultd did not become ready: %r" % seen)
            chunk = os.read(self.process.stderr.fileno(), 4096)
            if not chunk:
                raise AssertionError("vaultd exited before it was ready: %r" % seen)
            seen += chunk

    def stop(self, sig=signal.SIGTERM):
        """Sends ``sig`` and waits (at most 30 s) for the exit."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self.process.stderr.close()
        self.process = None


@unittest.skipUnless(
    os.environ.get("VAULTD_CLIENT_TEST_VAULTD"), "set VAULTD_CLIENT_TEST_VAULTD (PythonClientTests does)"
)
class ReconnectTests(unittest.TestCase):
    """A subscription that outlives a restart of a real vaultd."""

    def test_reconnecting_stream_outlives_a_restart(self):
        """Should, with reconnect, report the loss, subscribe again once vaultd is back, and deliver a later login."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with self.subTest(signal=sig.name), tempfile.TemporaryDirectory() as directory:
                daemon = _Vaultd(os.environ["VAULTD_CLIENT_TEST_VAULTD"], directory)
                daemon.start()
                self.addCleanup(daemon.stop, signal.SIGKILL)
                user = "py-back-%s" % uuid.uuid4().hex[:8]
                vault = Client(daemon.socket_path, timeout=30)
                stream = vault.subscribe(
                    provider="demo", timeout=30, reconnect=ReconnectPolicy(first_delay=0.1, max_delay=1)
                )
                lost, back = [], []

                def disconnected(why):
                    # vaultd is gone: start it again before the first attempt is due.
                    lost.append(why)
                    daemon.start()

                def reconnected(snapshot):
                    # Subscribed again: a login now can only reach this stream as an event.
                    back.append(snapshot)
                    with Client(daemon.socket_path, timeout=30) as again:
                        again.login("demo", user, token=SECRET)

                stream.on_disconnect = disconnected
                stream.on_reconnect = reconnected
                daemon.stop(sig)
                event = stream.next_event(timeout=60)
                self.assertEqual(len(lost), 1, lost)
                if sig == signal.SIGTERM:
                    self.assertIn("ERR_INTERNAL", lost[0])
                self.assertEqual(back, [[]], "the snapshot after the restart (a memory store starts empty)")
                self.assertIsNotNone(event, "no event after the restart (stream end: %r)" % (stream.end,))
                self.assertEqual((event.kind, event.provider, event.user), ("loginSuccess", "demo", user))
                self.assertEqual(stream.reconnections, 1)
                self.assertIsNone(stream.end)
                stream.close()
                vault.close()
                daemon.stop()

    def test_next_event_stays_bounded_while_reconnecting(self):
        """Should return None from next_event(timeout=...) in time while vaultd is away, and go on once it is back."""
        with tempfile.TemporaryDirectory() as directory:
            daemon = _Vaultd(os.environ["VAULTD_CLIENT_TEST_VAULTD"], directory)
            daemon.start()
            self.addCleanup(daemon.stop, signal.SIGKILL)
            user = "py-wait-%s" % uuid.uuid4().hex[:8]
            with Client(daemon.socket_path, timeout=30) as vault:
                stream = vault.subscribe(provider="demo", reconnect=ReconnectPolicy(first_delay=0.1, max_delay=0.2))
                daemon.stop(signal.SIGKILL)
                started = time.monotonic()
                self.assertIsNone(stream.next_event(timeout=0.5))
                self.assertLess(time.monotonic() - started, 5, "next_event waited past its timeout")
                self.assertEqual((stream.end, stream.reconnections), ("closed", 0))

                def reconnected(snapshot):
                    with Client(daemon.socket_path, timeout=30) as again:
                        again.login("demo", user, token=SECRET)

                stream.on_reconnect = reconnected
                daemon.start()
                event = stream.next_event(timeout=60)
                self.assertIsNotNone(event, "no event once vaultd was back (stream end: %r)" % (stream.end,))
                self.assertEqual((event.kind, event.user, stream.reconnections), ("loginSuccess", user, 1))
                stream.close()
            daemon.stop()

    def test_stream_without_reconnect_ends_with_vaultd(self):
        """Should, without reconnect (the default), end the iteration when vaultd is killed."""
        with tempfile.TemporaryDirectory() as directory:
            daemon = _Vaultd(os.environ["VAULTD_CLIENT_TEST_VAULTD"], directory)
            daemon.start()
            self.addCleanup(daemon.stop, signal.SIGKILL)
            with Client(daemon.socket_path, timeout=30) as vault, vault.subscribe(timeout=30) as stream:
                daemon.stop(signal.SIGKILL)
                self.assertIsNone(next(stream, None))
                self.assertEqual((stream.end, stream.reconnections), ("closed", 0))
