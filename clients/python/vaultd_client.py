"""A Python client for vaultd, the credential-vault daemon: standard library only.

It speaks Varlink itself (JSON objects, each ended by a NUL byte, on a Unix
stream socket) and needs no other package. One typed call per method of the
interface ``io.vaultd.Vault`` (docs/io.vaultd.Vault.varlink), with snake_case
names and keyword arguments; results are frozen dataclasses; errors are
exceptions.

    import vaultd_client

    with vaultd_client.Client(timeout=10) as vault:      # the socket vaultctl uses
        vault.login("demo", "alice", token="my-token-value-1234567890")
        token = vault.get_token("demo", "alice", min_valid_seconds=300)
        print(token)               # Token(value='my********90', ...): masked
        use(token.value)           # the token itself

Results are dataclasses rather than TypedDicts so that a token can be masked
in ``repr()`` (a dict prints every value it holds), fields are attributes an
editor can complete, and what vaultd sent stays in ``raw`` for fields this
version does not know yet.

Connection problems raise ``VaultdConnectionError`` (which says what to do:
is vaultd running? which socket was tried); error replies raise
``VaultdError`` (of the error's own subclass, such as ``NotLoggedIn``) with
the Varlink error name, vaultd's code (``ERR_NOT_LOGGED_IN``), the message and
the parameters. Tokens never appear
in an exception's text or a result's ``repr()``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pwd
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

__version__ = "0.1.0"

__all__ = [
    "BrowserLoginStart",
    "Client",
    "ClientConnection",
    "DeviceLoginPoll",
    "DeviceLoginStart",
    "EVENT_KINDS",
    "Event",
    "EventStream",
    "INTERFACE",
    "LoginResult",
    "ReconnectPolicy",
    "Session",
    "SessionPage",
    "Token",
    "UserProfile",
    "VaultdClientError",
    "VaultdConnectionError",
    "VaultdError",
    "VaultdProtocolError",
    "VaultdTimeoutError",
    "VaultdUntrustedSocketError",
    "default_socket_path",
    "mask",
]

#: The Varlink interface this client speaks.
INTERFACE = "io.vaultd.Vault"

#: The socket of vaultd's system instance.
SYSTEM_SOCKET = "/run/vaultd/socket"

#: The user vaultd's system instance runs as (``DynamicUser=``); a socket it
#: serves is trusted like one served by root.
SYSTEM_SERVICE_USER = "vaultd"

#: The event kinds vaultd sends (``Event.kind``); a later vaultd may add more.
EVENT_KINDS = (
    "loginSuccess",
    "loginFailed",
    "logoutSuccess",
    "logoutFailed",
    "tokenRefreshed",
    "tokenExpired",
    "tokenInvalid",
    "kickedOffline",
    "connectionChanged",
    "storeChanged",
    "tokenFileFailed",
)

#: The largest message this client reads (as the Swift client).
MAX_MESSAGE_SIZE = 16 << 20

_STARS = "********"


def mask(secret: Optional[str]) -> Optional[str]:
    """``secret`` masked as vaultd masks it: at most four characters shown and
    never more than a quarter of them (the first and last two around eight
    stars from 16 characters on, the first and last one from 8, stars only below)."""
    if secret is None:
        return None
    shown = 2 if len(secret) >= 16 else 1 if len(secret) >= 8 else 0
    if shown == 0:
        return _STARS
    return secret[:shown] + _STARS + secret[-shown:]


def default_socket_path(environ: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """Where vaultd listens unless told otherwise, found as vaultd and vaultctl
    find it: ``$VAULTD_SOCKET`` when set; else ``$XDG_RUNTIME_DIR/vaultd/socket``;
    else ``/run/vaultd/socket`` for root and ``/run/user/UID/vaultd/socket`` for
    anyone else."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    explicit = environ.get("VAULTD_SOCKET", "")
    if explicit:
        return explicit
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return runtime + "/vaultd/socket"
    return SYSTEM_SOCKET if uid == 0 else "/run/user/%d/vaultd/socket" % uid


# MARK: Errors


class VaultdClientError(Exception):
    """Everything this module raises derives from this."""


class VaultdError(VaultdClientError):
    """vaultd answered a call with an error.

    ``name`` is the Varlink error name (``io.vaultd.Vault.NotLoggedIn``),
    ``code`` vaultd's code from the error's parameters (``ERR_NOT_LOGGED_IN``;
    None for ``org.varlink.service`` errors), ``message`` what happened and what
    to do, ``provider_code`` and ``provider_message`` the provider's own code
    and words when it named them (``invalid_grant``, a helper's
    ``AUTH_ERR_APIKEY_NOT_FOUND``), ``parameters`` the error's parameters as
    they came. vaultd never puts a secret in them."""

    def __init__(self, name: str, parameters: Optional[Mapping[str, Any]] = None) -> None:
        self.name = name
        self.parameters: Dict[str, Any] = dict(parameters or {})
        code = self.parameters.get("code")
        self.code: Optional[str] = code if isinstance(code, str) else None
        provider_code = self.parameters.get("providerCode")
        self.provider_code: Optional[str] = provider_code if isinstance(provider_code, str) else None
        provider_message = self.parameters.get("providerMessage")
        self.provider_message: Optional[str] = provider_message if isinstance(provider_message, str) else None
        message = self.parameters.get("message")
        parameter = self.parameters.get("parameter")
        if isinstance(message, str):
            self.message = message
        elif isinstance(parameter, str):
            self.message = "invalid parameter '%s'" % parameter
        else:
            self.message = name
        provider = "; provider: %s" % self.provider_code if self.provider_code else ""
        super().__init__("%s (%s%s)" % (self.message, self.code or self.name, provider))

    @property
    def short_name(self) -> str:
        """The error's name without its interface: ``NotLoggedIn``."""
        return self.name.rsplit(".", 1)[-1]


# The errors of io.vaultd.Vault, one class each, so that a caller can write
# ``except vaultd_client.NotLoggedIn``. A name this version does not know
# raises VaultdError itself. A test fails when the interface gains one.

class NotLoggedIn(VaultdError):
    """The account is not logged in (ERR_NOT_LOGGED_IN)."""


class LoginInProgress(VaultdError):
    """A login of the account is already in progress."""


class UnknownProvider(VaultdError):
    """The provider is not defined in vaultd.conf (ERR_PROVIDER_NOT_FOUND)."""


class InvalidCredential(VaultdError):
    """The token is missing, empty or malformed (AUTH_ERR_AUTH_TOKEN_NOT_FOUND)."""


class TokenExpired(VaultdError):
    """The token has expired, or would before min_valid_seconds (ERR_TOKEN_EXPIRED)."""


class UserDeactivated(VaultdError):
    """The user is deactivated at the provider (ERR_USER_DEACTIVATED)."""


class UidNotFound(VaultdError):
    """The user id is unknown at the provider (ERR_UID_NOT_FOUND)."""


class AccessDenied(VaultdError):
    """The caller may not use this account."""


class StoreUnavailable(VaultdError):
    """The secret store cannot be reached."""


class StoreLocked(VaultdError):
    """The secret store's collection is locked."""


class StoreFailed(VaultdError):
    """The secret store refused or failed a read or write."""


class InvalidParameter(VaultdError):
    """A parameter has a bad value."""


class NetworkError(VaultdError):
    """The provider could not be reached (ERR_NETWORK_ERROR)."""


class InvalidConfig(VaultdError):
    """The configuration is invalid."""


class SubscriberTooSlow(VaultdError):
    """The subscriber did not read its events fast enough and was dropped."""


class TooManySubscriptions(VaultdError):
    """The caller's user holds as many Subscribe streams as vaultd allows one user."""


class TooManySessions(VaultdError):
    """The session's owner holds as many sessions as vaultd allows one user."""


class SessionTooLarge(VaultdError):
    """The session record (tokens and profile) is larger than MaxSessionSize=."""


class RefreshTooSoon(VaultdError):
    """The tokens were refreshed less than MinRefreshInterval= ago and are still valid."""


class TooManyConnections(VaultdError):
    """The caller's user (or everyone) holds as many connections as vaultd allows."""


class ReplyTooLarge(VaultdError):
    """The reply would take more than the connection may have queued: ask for less."""


class InternalError(VaultdError):
    """vaultd failed in a way it did not expect (also: vaultd is stopping)."""


class TooManyClients(VaultdError):
    """As many clients report their connection for the session as vaultd lists."""


class HelperUnavailable(VaultdError):
    """The exec provider's helper program is missing or cannot be run."""


class LoginBackingOff(VaultdError):
    """A login that asks the provider failed lately; none starts before the backoff ends."""


class RefreshBackingOff(VaultdError):
    """The session's last refresh failed; no refresh a client asks for is sent
    before the backoff ends (``parameters["retryAt"]``, Unix seconds)."""


class TooManyProviderRequests(VaultdError):
    """The caller's user made as many provider requests as vaultd allows one
    user; nothing was sent; try again from ``parameters["retryAt"]`` on."""


class TooManyRevocations(VaultdError):
    """The owner's sessions and its revocations the provider has not accepted
    yet fill MaxSessionsPerUser=: the login is refused."""


class InvalidClient(VaultdError):
    """The provider refused vaultd's own credentials for it: invalid_client,
    a 401 of the token endpoint, a helper's wrong API key (ERR_INVALID_CLIENT)."""


class GrantRevoked(VaultdError):
    """The provider no longer honours the session's grant, OAuth 2.0's
    invalid_grant: log in again (ERR_GRANT_REVOKED)."""


class CannotRefresh(VaultdError):
    """The session cannot be refreshed: its provider cannot, or it holds no
    refresh token (ERR_CANNOT_REFRESH)."""


class LoginDenied(VaultdError):
    """The user refused the device login at the provider, OAuth 2.0's
    access_denied (ERR_LOGIN_DENIED)."""


class LoginExpired(VaultdError):
    """The interactive login (device or browser) is over before it was
    finished: no such pending login is the caller's (it finished, expired, or
    vaultd restarted), or the device code expired (ERR_LOGIN_EXPIRED)."""


class AuthorizationFailed(VaultdError):
    """A browser login brought no authorization: an error redirect (the
    server's code as provider_code) or another login's state
    (ERR_AUTHORIZATION_FAILED)."""


_ERRORS = {cls.__name__: cls for cls in VaultdError.__subclasses__()}


def _error(name: str, parameters: Optional[Mapping[str, Any]]) -> VaultdError:
    """The exception for an error reply: the class of its name for errors of
    io.vaultd.Vault, VaultdError for any other."""
    interface, _, short = name.rpartition(".")
    cls = _ERRORS.get(short, VaultdError) if interface == INTERFACE else VaultdError
    return cls(name, parameters)


__all__.extend(sorted(_ERRORS))


class VaultdConnectionError(VaultdClientError):
    """No answer came: nothing serves the socket, the connection broke, or it
    is served by someone this client must not trust. ``socket_path`` is the
    socket that was tried."""

    def __init__(self, message: str, socket_path: str) -> None:
        self.socket_path = socket_path
        super().__init__(message)


class VaultdTimeoutError(VaultdConnectionError):
    """A connect, send or receive waited longer than the client's timeout."""


class VaultdUntrustedSocketError(VaultdConnectionError):
    """The socket is served by a process of another user (``peer_uid``), not by
    root, this process's user, or vaultd's system user: nothing was sent."""

    def __init__(self, socket_path: str, peer_uid: int) -> None:
        self.peer_uid = peer_uid
        super().__init__(
            "the socket %s is served by uid %d, not by root or you; refusing to send credentials. "
            "Someone may have put their own socket in vaultd's place: check who owns its directory, "
            "or pass the right socket_path" % (socket_path, peer_uid),
            socket_path,
        )


class VaultdProtocolError(VaultdClientError):
    """vaultd answered with something the interface does not declare (a reply
    that is not JSON, a field of the wrong type). The text names the method and
    the field, never the reply's content, which may hold a token."""


# MARK: Results


class _Reader:
    """Reads the fields of one reply object, raising VaultdProtocolError that
    names the field (never its value) when one is missing or of the wrong type."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise VaultdProtocolError("vaultd sent %s that is not an object" % where)
        self.obj = obj
        self.where = where

    def _get(self, key: str, kinds: tuple, required: bool) -> Any:
        value = self.obj.get(key)
        if value is None:
            if required:
                raise VaultdProtocolError("vaultd sent %s without '%s'" % (self.where, key))
            return None
        # bool is an int in Python: keep the two apart.
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise VaultdProtocolError("vaultd sent %s with a bad '%s'" % (self.where, key))
        return value

    def string(self, key: str) -> str:
        return self._get(key, (str,), True)

    def opt_string(self, key: str) -> Optional[str]:
        return self._get(key, (str,), False)

    def integer(self, key: str) -> int:
        return self._get(key, (int,), True)

    def opt_int(self, key: str) -> Optional[int]:
        return self._get(key, (int,), False)

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self._get(key, (bool,), False)
        return default if value is None else value

    def opt_object(self, key: str) -> Optional[dict]:
        return self._get(key, (dict,), False)

    def opt_list(self, key: str) -> Optional[list]:
        return self._get(key, (list,), False)


@dataclass(frozen=True)
class UserProfile:
    """The user a session belongs to: the fields of CometChat's User object
    (``io.vaultd.Vault`` type ``UserProfile``). Times are Unix seconds."""

    uid: str
    name: Optional[str] = None
    avatar: Optional[str] = None
    role: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None
    status: Optional[str] = None
    status_message: Optional[str] = None
    last_active_at: Optional[int] = None
    deactivated_at: Optional[int] = None

    @classmethod
    def from_json(cls, obj: Any) -> "UserProfile":
        """Reads a ``UserProfile`` object as vaultd sends it."""
        r = _Reader(obj, "a profile")
        return cls(
            uid=r.string("uid"),
            name=r.opt_string("name"),
            avatar=r.opt_string("avatar"),
            role=r.opt_string("role"),
            metadata=r.opt_object("metadata"),
            status=r.opt_string("status"),
            status_message=r.opt_string("statusMessage"),
            last_active_at=r.opt_int("lastActiveAt"),
            deactivated_at=r.opt_int("deactivatedAt"),
        )

    def to_json(self) -> Dict[str, Any]:
        """The profile as ``Login`` takes it (unset fields left out)."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[_camel(f.name)] = value
        return out


@dataclass(frozen=True)
class ClientConnection:
    """A client that reports its own connection to the chat server
    (``SetConnectionState``): its name, pid, state (connecting, connected,
    connectFailed) and since when (Unix seconds)."""

    name: str
    pid: int
    state: str
    since: int

    @classmethod
    def from_json(cls, obj: Any) -> "ClientConnection":
        """Reads a ``ClientConnection`` object as vaultd sends it."""
        r = _Reader(obj, "a session's client")
        return cls(name=r.string("name"), pid=r.integer("pid"), state=r.string("state"), since=r.integer("since"))


@dataclass(frozen=True)
class Session:
    """A session as vaultd shows it (``io.vaultd.Vault`` type ``Session``).
    Holds no secret: ``masked_token`` is the token as vaultd masks it (the wire
    field ``token``). Times are Unix seconds; ``raw`` is the object as vaultd
    sent it, fields this client does not know included."""

    provider: str
    user: str
    state: str
    has_refresh_token: bool
    profile: Optional[UserProfile] = None
    created_at: Optional[int] = None
    expires_at: Optional[int] = None
    owner_uid: Optional[int] = None
    token_type: Optional[str] = None
    scope: Optional[str] = None
    instance_url: Optional[str] = None
    masked_token: Optional[str] = field(default=None, metadata={"wire": "token"})
    refresh_at: Optional[int] = None
    last_refresh_at: Optional[int] = None
    consecutive_failures: Optional[int] = None
    last_error: Optional[str] = None
    next_retry_at: Optional[int] = None
    connection: Optional[str] = None
    clients: List[ClientConnection] = field(default_factory=list)
    last_error_code: Optional[str] = None
    token_file_error: Optional[str] = None
    last_provider_code: Optional[str] = None
    last_provider_message: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False, metadata={"wire": None})

    @classmethod
    def from_json(cls, obj: Any) -> "Session":
        """Reads a ``Session`` object as vaultd sends it."""
        r = _Reader(obj, "a session")
        profile = r.opt_object("profile")
        return cls(
            provider=r.string("provider"),
            user=r.string("user"),
            state=r.string("state"),
            has_refresh_token=r.boolean("hasRefreshToken"),
            profile=UserProfile.from_json(profile) if profile is not None else None,
            created_at=r.opt_int("createdAt"),
            expires_at=r.opt_int("expiresAt"),
            owner_uid=r.opt_int("ownerUid"),
            token_type=r.opt_string("tokenType"),
            scope=r.opt_string("scope"),
            instance_url=r.opt_string("instanceUrl"),
            # Masked by vaultd; masked again here so that no version of vaultd
            # can put more than four characters of a token in a repr().
            masked_token=_remask(r.opt_string("token")),
            refresh_at=r.opt_int("refreshAt"),
            last_refresh_at=r.opt_int("lastRefreshAt"),
            consecutive_failures=r.opt_int("consecutiveFailures"),
            last_error=r.opt_string("lastError"),
            next_retry_at=r.opt_int("nextRetryAt"),
            connection=r.opt_string("connection"),
            clients=[ClientConnection.from_json(c) for c in (r.opt_list("clients") or [])],
            last_error_code=r.opt_string("lastErrorCode"),
            token_file_error=r.opt_string("tokenFileError"),
            last_provider_code=r.opt_string("lastProviderCode"),
            last_provider_message=r.opt_string("lastProviderMessage"),
            raw=dict(obj),
        )


def _remask(value: Optional[str]) -> Optional[str]:
    """vaultd's masked token as it is when it already is a mask, else masked."""
    if value is None or (_STARS in value and len(value.replace(_STARS, "", 1)) <= 4):
        return value
    return mask(value)


@dataclass(frozen=True)
class LoginResult:
    """The answer to ``Login``: the session (new, or the one already there),
    whether it was created, and whether a login with ``replace`` replaced a
    logged-in session's tokens."""

    session: Session
    created: bool
    replaced: bool = False


@dataclass(frozen=True)
class DeviceLoginStart:
    """The answer to ``StartDeviceLogin`` (RFC 8628): show the user
    ``verification_uri`` and ``user_code`` (or ``verification_uri_complete``),
    then call ``poll_device_login(login)`` until it is done. The device code
    stays in vaultd."""

    login: str
    user_code: str
    verification_uri: str
    expires_in: int
    interval: int
    verification_uri_complete: Optional[str] = None


@dataclass(frozen=True)
class DeviceLoginPoll:
    """The answer to ``PollDeviceLogin``: ``pending`` (call again; vaultd keeps
    the pace, ``interval`` seconds apart) or the login, as ``Login`` answers it."""

    pending: bool
    interval: Optional[int] = None
    session: Optional[Session] = None
    created: bool = False
    replaced: bool = False


@dataclass(frozen=True)
class BrowserLoginStart:
    """The answer to ``BeginBrowserLogin``: the pending login's id, the
    authorization URL to open, the state its redirect must bring back and when
    vaultd drops it (Unix seconds). The PKCE verifier stays in vaultd."""

    login: str
    authorization_url: str
    state: str
    expires_at: int


@dataclass(frozen=True)
class SessionPage:
    """One page of ``ListSessions``: the sessions, the cursor of the next page
    (pass it back as ``after``; None on the last) and the store's state
    (available, unavailable, locked)."""

    sessions: List[Session]
    next: Optional[str] = None
    store: Optional[str] = None


@dataclass(frozen=True)
class Token:
    """An access token from ``GetToken``. ``value`` is the token itself; the
    ``repr()`` (and so ``str()``) shows it masked. ``owner_uid`` says whose
    session it came from; ``expires_at`` is Unix seconds; ``scope`` the
    OAuth 2.0 scope granted, when the provider said."""

    value: str = field(repr=False)
    token_type: Optional[str] = None
    expires_at: Optional[int] = None
    instance_url: Optional[str] = None
    owner_uid: int = -1
    scope: Optional[str] = None

    def __repr__(self) -> str:
        return "Token(value=%r, token_type=%r, expires_at=%r, instance_url=%r, owner_uid=%r, scope=%r)" % (
            mask(self.value),
            self.token_type,
            self.expires_at,
            self.instance_url,
            self.owner_uid,
            self.scope,
        )

    __str__ = __repr__

    @property
    def masked(self) -> str:
        """The token masked, as vaultd shows it."""
        return mask(self.value) or ""


@dataclass(frozen=True)
class Event:
    """Something that happened to a session (``io.vaultd.Vault`` type
    ``Event``): ``kind`` is one of ``EVENT_KINDS`` (a later vaultd may send
    others), ``reason`` says why, ``code`` is vaultd's code of a failure and
    ``provider_code`` the provider's own; times are Unix seconds. Holds no
    secret."""

    kind: str
    provider: str
    user: str
    owner_uid: int
    time: int
    reason: Optional[str] = None
    code: Optional[str] = None
    expires_at: Optional[int] = None
    message: Optional[str] = None
    source: Optional[str] = None
    client: Optional[str] = None
    provider_code: Optional[str] = None
    provider_message: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False, metadata={"wire": None})

    @classmethod
    def from_json(cls, obj: Any) -> "Event":
        """Reads an ``Event`` object as vaultd sends it."""
        r = _Reader(obj, "an event")
        return cls(
            kind=r.string("kind"),
            provider=r.string("provider"),
            user=r.string("user"),
            owner_uid=r.integer("ownerUid"),
            time=r.integer("time"),
            reason=r.opt_string("reason"),
            code=r.opt_string("code"),
            expires_at=r.opt_int("expiresAt"),
            message=r.opt_string("message"),
            source=r.opt_string("source"),
            client=r.opt_string("client"),
            provider_code=r.opt_string("providerCode"),
            provider_message=r.opt_string("providerMessage"),
            raw=dict(obj),
        )


def _camel(name: str) -> str:
    """snake_case to the wire's camelCase: ``owner_uid`` -> ``ownerUid``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(name: str) -> str:
    """CamelCase or camelCase to snake_case: ``GetToken`` -> ``get_token``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# MARK: The connection


class _Connection:
    """One Varlink connection: NUL-framed JSON messages on a Unix socket, with
    the peer checked before anything is sent."""

    def __init__(self, path: str, timeout: Optional[float], connect_timeout: Optional[float]) -> None:
        self.path = path
        #: How long a send or receive waits (None: without limit).
        self.timeout = timeout
        self._buffer = bytearray()
        self._broken: Optional[str] = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout if connect_timeout is not None else timeout)
            try:
                sock.connect(path)
            except socket.timeout:
                raise VaultdTimeoutError(
                    "vaultd at %s did not accept the connection in time (its listen queue is full): it may be "
                    "stuck or overloaded; check its log (journalctl --user -u vaultd) or allow a longer "
                    "connect_timeout" % path,
                    path,
                ) from None
            except OSError as error:
                raise VaultdConnectionError(
                    "vaultd is not reachable at %s (%s). Is vaultd running? Start it (systemctl --user start "
                    "vaultd), or point the client at its socket: Client(socket_path=...) or $VAULTD_SOCKET"
                    % (path, error.strerror or error),
                    path,
                ) from None
            sock.settimeout(timeout)
            peer = self._peer_uid(sock, path)
            if not self.trusts(peer, os.geteuid()):
                raise VaultdUntrustedSocketError(path, peer)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    @staticmethod
    def _peer_uid(sock: socket.socket, path: str) -> int:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except (OSError, AttributeError) as error:
            raise VaultdConnectionError("cannot tell who serves %s: %s" % (path, error), path) from None
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid

    @staticmethod
    def trusts(peer: int, euid: int) -> bool:
        """Whether a socket served by ``peer`` may receive this process's calls:
        root, this process's effective user, or vaultd's system user."""
        if peer in (0, euid):
            return True
        try:
            return pwd.getpwnam(SYSTEM_SERVICE_USER).pw_uid == peer
        except KeyError:
            return False

    def settimeout(self, timeout: Optional[float]) -> None:
        """Changes how long the next sends and receives wait (None: without
        limit); nothing on a connection already closed."""
        try:
            self.sock.settimeout(timeout)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _break(self, why: str) -> None:
        """A call that got no reply leaves the connection unusable: Varlink
        replies carry no call id, so a late reply would be read as the next
        call's."""
        self._broken = why
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def call(self, method: str, parameters: Mapping[str, Any], more: bool = False) -> Dict[str, Any]:
        """Sends one call and returns its first reply (error replies included)."""
        if self._broken is not None:
            raise VaultdConnectionError(
                "an earlier call on this connection to %s failed (%s); open a new Client" % (self.path, self._broken),
                self.path,
            )
        message: Dict[str, Any] = {"method": method}
        params = {k: v for k, v in parameters.items() if v is not None}
        if params:
            message["parameters"] = params
        if more:
            message["more"] = True
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\0"
        try:
            self._send(data)
        except VaultdConnectionError as error:
            # vaultd may have refused the connection (TooManyConnections) with a
            # reply and closed it before the call went out: that reply says why.
            try:
                reply = self.receive()
            except VaultdClientError:
                reply = None
            if reply is not None and "error" in reply:
                return reply
            self._break(str(error))
            raise
        try:
            return self.receive()
        except VaultdClientError as error:
            self._break(str(error))
            raise

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data, socket.MSG_NOSIGNAL)
        except socket.timeout:
            raise VaultdTimeoutError(self._slow("sending a call"), self.path) from None
        except OSError as error:
            raise VaultdConnectionError(
                "sending to vaultd at %s failed (%s)" % (self.path, error.strerror or error), self.path
            ) from None

    def _slow(self, waiting: str) -> str:
        return (
            "vaultd at %s did not answer in time (%s); it may be stuck or overloaded: check its log "
            "(journalctl --user -u vaultd), or allow longer (Client(timeout=SECONDS))" % (self.path, waiting)
        )

    def receive(self) -> Dict[str, Any]:
        """The next reply; a connection closed before it came is an error."""
        reply = self.next_reply()
        if reply is None:
            raise VaultdConnectionError("vaultd at %s closed the connection before replying" % self.path, self.path)
        return reply

    def next_reply(self) -> Optional[Dict[str, Any]]:
        """The next reply, or None when vaultd closed the connection between
        messages. A timeout loses nothing: bytes read so far stay buffered."""
        while True:
            end = self._buffer.find(b"\0")
            if end >= 0:
                frame = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                try:
                    reply = json.loads(frame.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    raise VaultdProtocolError("vaultd at %s sent a message that is not JSON" % self.path) from None
                if not isinstance(reply, dict) or not isinstance(reply.get("parameters", {}), dict):
                    raise VaultdProtocolError("vaultd at %s sent a message that is not a Varlink reply" % self.path)
                return reply
            if len(self._buffer) > MAX_MESSAGE_SIZE:
                raise VaultdProtocolError("vaultd at %s sent a reply over %d bytes" % (self.path, MAX_MESSAGE_SIZE))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise VaultdTimeoutError(self._slow("waiting for a reply"), self.path) from None
            except OSError as error:
                raise VaultdConnectionError(
                    "reading from vaultd at %s failed (%s)" % (self.path, error.strerror or error), self.path
                ) from None
            if not chunk:
                if self._buffer:
                    raise VaultdConnectionError(
                        "vaultd at %s closed the connection in the middle of a reply" % self.path, self.path
                    )
                return None
            self._buffer += chunk


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a subscription outlives a restart of vaultd (``subscribe(reconnect=...)``):
    the first attempt after ``first_delay`` seconds, then twice as long after
    each failed one, at most ``max_delay`` apart; after ``max_attempts`` failed
    attempts in a row (None: no limit) the stream ends. ``reconnect=True``
    means the default: 1 s, doubling to 30 s, without end, as vaultctl."""

    first_delay: float = 1.0
    max_delay: float = 30.0
    max_attempts: Optional[int] = None

    def delay(self, attempt: int) -> float:
        """The wait before attempt ``attempt`` (1: the first after the loss), in seconds."""
        return min(self.first_delay * (2 ** min(max(attempt, 1) - 1, 30)), max(self.max_delay, self.first_delay))


#: The error codes that say "not now" rather than "not this": a subscription
#: refused or ended with one of them is tried again.
_RETRIED = frozenset(
    [
        "InternalError",
        "SubscriberTooSlow",
        "TooManySubscriptions",
        "TooManyConnections",
        "StoreUnavailable",
        "StoreLocked",
    ]
)


def _worth_retrying(error: BaseException) -> bool:
    """Whether a failed (re)subscription may work on another attempt: vaultd
    was away, starting, stopping or busy; not a refusal another attempt would
    meet again, nor a socket someone else serves."""
    if isinstance(error, VaultdUntrustedSocketError):
        return False
    if isinstance(error, VaultdError):
        return error.name.startswith(INTERFACE + ".") and error.short_name in _RETRIED
    return isinstance(error, VaultdConnectionError)


def _check(reply: Dict[str, Any]) -> Dict[str, Any]:
    """The reply's parameters, or the VaultdError it carries."""
    error = reply.get("error")
    if error is not None:
        raise _error(str(error), reply.get("parameters"))
    return reply.get("parameters") or {}


# MARK: The client


class Client:
    """A client of vaultd on one connection: one typed call per method of
    ``io.vaultd.Vault``, blocking. Use it as a context manager (the connection
    closes at the end) or call ``close()``.

    ``socket_path`` defaults to ``default_socket_path()`` (where vaultctl
    looks). ``timeout`` (seconds; None waits forever) bounds every send and
    receive, ``connect_timeout`` the connect (default: ``timeout``; a Unix
    socket connect waits only while vaultd's listen queue is full). Before
    anything is sent the client checks who serves the socket (``SO_PEERCRED``):
    root, this process's user or vaultd's system user, else
    ``VaultdUntrustedSocketError``. Calls from several threads are taken one at
    a time. After a call that got no reply (a timeout, a broken connection)
    every later call fails: open a new Client."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        *,
        timeout: Optional[float] = 60.0,
        connect_timeout: Optional[float] = None,
    ) -> None:
        self.socket_path = socket_path or default_socket_path()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conn = _Connection(self.socket_path, timeout, connect_timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection (and so ends this client's ``set_connection_state`` reports)."""
        self._conn.close()

    def __repr__(self) -> str:
        return "Client(socket_path=%r, timeout=%r)" % (self.socket_path, self.timeout)

    def call(self, method: str, parameters: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Calls ``method`` (its full name: ``io.vaultd.Vault.GetToken``) with
        ``parameters`` (None values left out) and returns the reply's
        parameters; an error reply raises ``VaultdError``. For what the typed
        calls do not cover."""
        with self._lock:
            return _check(self._conn.call(method, parameters or {}))

    def _vault(self, method: str, **parameters: Any) -> Dict[str, Any]:
        return self.call(INTERFACE + "." + method, {_camel(k): v for k, v in parameters.items()})

    @staticmethod
    def _session(parameters: Dict[str, Any], method: str) -> Session:
        if "session" not in parameters:
            raise VaultdProtocolError("vaultd answered %s without a session" % method)
        return Session.from_json(parameters["session"])

    # MARK: Methods of io.vaultd.Vault

    def login(
        self,
        provider: str,
        user: str,
        *,
        token: Optional[str] = None,
        token_response: Union[Mapping[str, Any], str, bytes, None] = None,
        profile: Union[UserProfile, Mapping[str, Any], None] = None,
        expires_at: Optional[int] = None,
        owner_uid: Optional[int] = None,
        replace: Optional[bool] = None,
    ) -> LoginResult:
        """Logs an account in with a ready ``token`` (a CometChat authToken, an
        OpenIM token) or an OAuth 2.0 ``token_response`` as the token endpoint
        sent it (a dict, or its JSON text); with neither, the provider issues
        the tokens (client credentials, an exec helper; a privilege, see the
        README). ``expires_at`` (Unix seconds) overrides ``expires_in`` and a
        JWT's exp. An account already logged in answers with its session and
        ``created`` False; with ``replace`` its tokens are replaced instead."""
        if token is not None and token_response is not None:
            raise ValueError("login takes a token or a token_response, not both")
        if isinstance(token_response, (str, bytes)):
            try:
                token_response = json.loads(token_response)
            except ValueError:
                raise ValueError("token_response is not JSON text") from None
            if not isinstance(token_response, dict):
                raise ValueError("token_response is not a JSON object")
        if isinstance(profile, UserProfile):
            profile = profile.to_json()
        reply = self._vault(
            "Login",
            provider=provider,
            user=user,
            token=token,
            token_response=dict(token_response) if token_response is not None else None,
            profile=dict(profile) if profile is not None else None,
            expires_at=expires_at,
            owner_uid=owner_uid,
            replace=replace,
        )
        created = reply.get("created")
        replaced = reply.get("replaced")
        return LoginResult(
            session=self._session(reply, "Login"),
            created=created is True,
            replaced=replaced is True,
        )

    def start_device_login(
        self, provider: str, user: str, *, owner_uid: Optional[int] = None, replace: Optional[bool] = None
    ) -> DeviceLoginStart:
        """Starts a device login (RFC 8628) at an oauth2 provider with
        DeviceAuthorizationURL=: vaultd asks the provider for a user code and
        keeps the device code. Only this uid (or root) may poll it."""
        reply = self._vault("StartDeviceLogin", provider=provider, user=user, owner_uid=owner_uid, replace=replace)
        r = _Reader(reply, "a StartDeviceLogin reply")
        return DeviceLoginStart(
            login=r.string("login"),
            user_code=r.string("userCode"),
            verification_uri=r.string("verificationUri"),
            expires_in=r.integer("expiresIn"),
            interval=r.integer("interval"),
            verification_uri_complete=r.opt_string("verificationUriComplete"),
        )

    def poll_device_login(self, login: str) -> DeviceLoginPoll:
        """One poll of a device login: vaultd answers once its poll of the
        provider is due and done (up to 25 seconds plus one request: give the
        Client a timeout of a minute or more), pending or the login. The
        user's refusal raises LoginDenied, an expired code LoginExpired."""
        reply = self._vault("PollDeviceLogin", login=login)
        r = _Reader(reply, "a PollDeviceLogin reply")
        if r.boolean("pending"):
            return DeviceLoginPoll(pending=True, interval=r.opt_int("interval"))
        return DeviceLoginPoll(
            pending=False,
            session=self._session(reply, "PollDeviceLogin"),
            created=r.boolean("created"),
            replaced=r.boolean("replaced"),
        )

    def logout(self, provider: str, user: str, *, owner_uid: Optional[int] = None) -> None:
        """Logs an account out and deletes its stored session."""
        self._vault("Logout", provider=provider, user=user, owner_uid=owner_uid)

    def get_session(self, provider: str, user: str, *, owner_uid: Optional[int] = None) -> Session:
        """The session of one account (its token masked)."""
        return self._session(self._vault("GetSession", provider=provider, user=user, owner_uid=owner_uid), "GetSession")

    def list_sessions(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> SessionPage:
        """One page of the sessions the caller may see: at most ``limit``
        (vaultd's default 100 when None) after the cursor ``after``.
        ``all_sessions()`` follows the pages."""
        reply = self._vault("ListSessions", limit=limit, after=after)
        sessions = reply.get("sessions")
        if not isinstance(sessions, list):
            raise VaultdProtocolError("vaultd answered ListSessions without a sessions array")
        next_cursor = reply.get("next")
        store = reply.get("store")
        return SessionPage(
            sessions=[Session.from_json(s) for s in sessions],
            next=next_cursor if isinstance(next_cursor, str) else None,
            store=store if isinstance(store, str) else None,
        )

    def all_sessions(self, *, page_size: Optional[int] = None, max_pages: int = 100000) -> List[Session]:
        """Every session the caller may see, following ``ListSessions``' pages
        to the last (at most ``max_pages`` of them)."""
        sessions: List[Session] = []
        after: Optional[str] = None
        for _ in range(max_pages):
            page = self.list_sessions(limit=page_size, after=after)
            sessions.extend(page.sessions)
            if page.next is None or page.next == after:
                return sessions
            after = page.next
        raise VaultdProtocolError("vaultd's ListSessions did not end within %d pages" % max_pages)

    def get_token(
        self,
        provider: str,
        user: str,
        *,
        min_valid_seconds: Optional[int] = None,
        owner_uid: Optional[int] = None,
        wait_seconds: Optional[int] = None,
    ) -> Token:
        """The current access token of a session; with ``min_valid_seconds``,
        one valid at least that long (vaultd refreshes first where it can).
        For an account vaultd keeps logged in (AutoLogin=yes) that is not
        logged in now, vaultd waits up to ``wait_seconds`` (default 30) for its
        login. The ``Token``'s repr is masked; ``.value`` is the token."""
        reply = self._vault(
            "GetToken",
            provider=provider,
            user=user,
            min_valid_seconds=min_valid_seconds,
            owner_uid=owner_uid,
            wait_seconds=wait_seconds,
        )
        r = _Reader(reply, "a GetToken reply")
        return Token(
            value=r.string("token"),
            token_type=r.opt_string("tokenType"),
            expires_at=r.opt_int("expiresAt"),
            instance_url=r.opt_string("instanceUrl"),
            owner_uid=r.integer("ownerUid"),
            scope=r.opt_string("scope"),
        )

    def subscribe(
        self,
        *,
        provider: Optional[str] = None,
        user: Optional[str] = None,
        kinds: Optional[Sequence[str]] = None,
        timeout: Union[float, None, str] = "client",
        reconnect: Union[bool, ReconnectPolicy] = False,
    ) -> "EventStream":
        """Streams what happens to the sessions the caller may see, narrowed by
        ``provider``, ``user`` and ``kinds`` (of ``EVENT_KINDS``), on a
        connection of its own (a stream holds its connection while it lasts).
        The stream's ``snapshot`` holds the sessions at the start; iterating it
        yields ``Event``s. Each read waits at most ``timeout`` seconds (default:
        this client's; None waits forever) before raising ``VaultdTimeoutError``;
        ``next_event(timeout=...)`` waits without raising.

        With ``reconnect`` (True, or a ``ReconnectPolicy``) the stream outlives
        a restart of vaultd: when its connection closes or vaultd ends it, it
        connects again (1 s, doubling to 30 s apart, by default), subscribes
        with the same filters and goes on with the events after that;
        ``snapshot`` then holds the sessions as they are after the restart,
        ``reconnections`` counts the times, and the stream's ``on_disconnect(why)``
        and ``on_reconnect(snapshot)``, when set, are called. Events that
        happened while vaultd was away are not replayed: compare the
        snapshots. Without it (the default), iteration stops with the connection."""
        if isinstance(kinds, str):
            raise TypeError("kinds is a list of event kinds, not one string")
        if reconnect is True:
            policy: Optional[ReconnectPolicy] = ReconnectPolicy()
        elif isinstance(reconnect, ReconnectPolicy):
            policy = reconnect
        elif reconnect is False or reconnect is None:
            policy = None
        else:
            raise TypeError("reconnect is True, False or a ReconnectPolicy")
        read_timeout = self.timeout if timeout == "client" else timeout
        connect_timeout = self.connect_timeout if self.connect_timeout is not None else self.timeout
        path = self.socket_path

        def connect() -> _Connection:
            return _Connection(path, read_timeout, connect_timeout)

        conn = connect()
        try:
            return EventStream(
                conn,
                provider=provider,
                user=user,
                kinds=list(kinds) if kinds else None,
                reconnect=policy,
                connect=connect,
            )
        except BaseException:
            conn.close()
            raise

    def force_logout(
        self, provider: str, user: str, *, reason: Optional[str] = None, owner_uid: Optional[int] = None
    ) -> None:
        """Logs an account out at once (its chat server kicked it, or an admin
        says so); subscribers see ``kickedOffline`` with ``reason`` (default: kicked)."""
        self._vault("ForceLogout", provider=provider, user=user, reason=reason, owner_uid=owner_uid)

    def refresh(self, provider: str, user: str, *, owner_uid: Optional[int] = None) -> Session:
        """Refreshes the session's tokens now (joining a refresh in flight) and
        returns the session afterwards; at most once per MinRefreshInterval=
        after the last attempt while the token is valid (``RefreshTooSoon``),
        never during the backoff of a failed one (``RefreshBackingOff``), and
        within the caller's provider requests (``TooManyProviderRequests``);
        each refusal's ``parameters["retryAt"]`` says when to try again."""
        return self._session(self._vault("Refresh", provider=provider, user=user, owner_uid=owner_uid), "Refresh")

    def set_provider_secret(self, provider: str, *, secret: str) -> None:
        """Stores the OAuth 2.0 client secret of an oauth2 provider in the
        secret store (root, the admin group, or the user vaultd runs as)."""
        self._vault("SetProviderSecret", provider=provider, secret=secret)

    def report_rejected(
        self,
        provider: str,
        user: str,
        *,
        token: Optional[str] = None,
        token_hash: Optional[str] = None,
        owner_uid: Optional[int] = None,
    ) -> str:
        """Tells vaultd the chat server rejected ``token`` (only its SHA-256 is
        sent; or give ``token_hash``, 64 lowercase hex digits). Returns the
        outcome: ``refreshed``, ``ended`` (the provider cannot refresh it), or
        ``alreadyReplaced`` (it is no longer the current token: read it again)."""
        if (token is None) == (token_hash is None):
            raise ValueError("report_rejected takes a token or a token_hash, exactly one")
        if token is not None:
            token_hash = hashlib.sha256(token.encode("utf-8")).hexdigest()
        reply = self._vault("ReportRejected", provider=provider, user=user, token_hash=token_hash, owner_uid=owner_uid)
        outcome = reply.get("outcome")
        if not isinstance(outcome, str):
            raise VaultdProtocolError("vaultd answered ReportRejected without an outcome")
        return outcome

    def set_connection_state(
        self,
        provider: str,
        user: str,
        *,
        state: str,
        client: Optional[str] = None,
        owner_uid: Optional[int] = None,
    ) -> None:
        """Reports this client's own connection to the chat server for a
        session (``connecting``, ``connected``, ``connectFailed`` or
        ``kickedOffline``, which ends the session as ``force_logout`` does), as
        ``client`` (default: the executable's name). The report lasts as long
        as this Client's connection."""
        self._vault("SetConnectionState", provider=provider, user=user, state=state, client=client, owner_uid=owner_uid)

    def begin_browser_login(
        self,
        provider: str,
        user: str,
        *,
        redirect_uri: str,
        owner_uid: Optional[int] = None,
        replace: Optional[bool] = None,
    ) -> BrowserLoginStart:
        """Begins a browser login (authorization code with PKCE) of an oauth2
        provider with AuthorizationURL=; ``redirect_uri`` is the caller's
        loopback listener, ``http://127.0.0.1:PORT/``."""
        reply = self._vault(
            "BeginBrowserLogin", provider=provider, user=user, redirect_uri=redirect_uri, owner_uid=owner_uid,
            replace=replace,
        )
        values = [reply.get(name) for name in ("login", "authorizationUrl", "state", "expiresAt")]
        if not all(isinstance(v, str) for v in values[:3]) or not isinstance(values[3], int):
            raise VaultdProtocolError("vaultd answered BeginBrowserLogin without its fields")
        return BrowserLoginStart(*values)

    def finish_browser_login(self, login: str, *, code: str, state: str) -> LoginResult:
        """Finishes the browser login ``login`` with the code and state its
        redirect brought: vaultd exchanges the code and logs the account in."""
        reply = self._vault("FinishBrowserLogin", login=login, code=code, state=state)
        return LoginResult(
            session=self._session(reply, "FinishBrowserLogin"),
            created=reply.get("created") is True,
            replaced=reply.get("replaced") is True,
        )

    # MARK: org.varlink.service

    def get_info(self) -> Dict[str, Any]:
        """``org.varlink.service.GetInfo``: vendor, product, version, url, interfaces."""
        return self.call("org.varlink.service.GetInfo")

    def get_interface_description(self, interface: str = INTERFACE) -> str:
        """The interface definition text vaultd serves (``docs/io.vaultd.Vault.varlink``)."""
        reply = self.call("org.varlink.service.GetInterfaceDescription", {"interface": interface})
        description = reply.get("description")
        if not isinstance(description, str):
            raise VaultdProtocolError("vaultd answered GetInterfaceDescription without a description")
        return description


class EventStream:
    """A ``Subscribe`` stream: ``snapshot`` (the sessions when it started) and
    ``store``, then one ``Event`` per iteration. Iteration stops when vaultd
    closes the connection (``end`` is ``"closed"``) or ends the stream
    (``"finished"``); a stream vaultd ends with an error (``SubscriberTooSlow``
    when this reader fell behind, ``InternalError`` when vaultd stops) raises
    that ``VaultdError`` (``end`` holds it). A stream subscribed with
    ``reconnect`` connects again instead (see ``Client.subscribe``). Use it as
    a context manager, or call ``close()``."""

    def __init__(
        self,
        conn: _Connection,
        *,
        provider: Optional[str] = None,
        user: Optional[str] = None,
        kinds: Optional[List[str]] = None,
        reconnect: Optional[ReconnectPolicy] = None,
        connect: Optional[Any] = None,
    ) -> None:
        self._conn = conn
        self.end: Union[None, str, VaultdError] = None
        self._parameters = {"provider": provider, "user": user, "kinds": kinds}
        self._policy = reconnect if connect is not None else None
        self._connect = connect
        #: When the connection was lost: (attempts failed so far, monotonic time of the next).
        self._lost: Optional[tuple] = None
        self._closed = False
        #: How many times the stream connected and subscribed again.
        self.reconnections = 0
        #: Called with why, as the connection is lost (reconnecting streams).
        self.on_disconnect: Optional[Any] = None
        #: Called with the new snapshot after subscribing again (reconnecting streams).
        self.on_reconnect: Optional[Any] = None
        self.snapshot: List[Session] = []
        self.store: Optional[str] = None
        self._subscribe(conn)

    def _subscribe(self, conn: _Connection) -> None:
        """Sends ``Subscribe`` on ``conn`` and reads the snapshot."""
        first = _check(conn.call(INTERFACE + ".Subscribe", self._parameters, more=True))
        sessions = first.get("sessions")
        if not isinstance(sessions, list):
            raise VaultdProtocolError("vaultd's first Subscribe reply has no sessions")
        self.snapshot = [Session.from_json(s) for s in sessions]
        store = first.get("store")
        self.store = store if isinstance(store, str) else None

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the stream (closes its connection; a reconnecting stream stops reconnecting)."""
        self._closed = True
        self._conn.close()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        event = self._next(None)
        if event is None:
            raise StopIteration
        return event

    def next_event(self, timeout: Union[float, None, str] = "stream") -> Optional[Event]:
        """The next event, waiting at most ``timeout`` seconds (default: the
        stream's; None waits forever); None when none came by then or the
        stream ended (see ``end``). A timeout loses nothing: the stream goes on
        (a reconnecting stream goes on reconnecting at the next call)."""
        wait = self._conn.timeout if timeout == "stream" else timeout
        deadline = None if wait is None else time.monotonic() + wait
        try:
            return self._next(deadline, forever=wait is None)
        except VaultdTimeoutError:
            return None
        finally:
            self._conn.settimeout(self._conn.timeout)

    def _next(self, deadline: Optional[float], forever: bool = False) -> Optional[Event]:
        """The next event: reads bounded by ``deadline`` (monotonic), else
        without limit when ``forever``, else by the stream's timeout."""
        # Bounded by the connection: each turn reads one reply or makes one
        # reconnection attempt (bounded by the policy or the deadline).
        while True:
            if self._lost is not None:
                if not self._reconnect(deadline):
                    if self._lost is not None and not self._closed:
                        path = self._conn.path
                        raise VaultdTimeoutError("still reconnecting to vaultd at %s" % path, path)
                    break
                continue
            if self.end is not None:
                break
            if deadline is not None:
                self._conn.settimeout(max(deadline - time.monotonic(), 0.001))
            elif forever:
                self._conn.settimeout(None)
            try:
                reply = self._conn.next_reply()
            except VaultdTimeoutError:
                raise
            except VaultdConnectionError as error:
                if self._policy is None or self._closed:
                    raise
                self._lose(str(error))
                continue
            if reply is None:
                self.end = "closed"
                if self._policy is not None and not self._closed:
                    self._lose("vaultd closed the connection")
                    continue
                return None
            if "error" in reply:
                error = _error(str(reply["error"]), reply.get("parameters"))
                self.end = error
                if self._policy is not None and not self._closed:
                    self._lose(str(error))
                    continue
                raise error
            if not reply.get("continues"):
                self.end = "finished"
            event = (reply.get("parameters") or {}).get("event")
            if event is not None:
                return Event.from_json(event)
            store = (reply.get("parameters") or {}).get("store")
            if isinstance(store, str):
                self.store = store
        if isinstance(self.end, VaultdError):
            raise self.end
        return None

    def _lose(self, why: str) -> None:
        """The connection was lost: the first attempt is due after the policy's first delay."""
        assert self._policy is not None
        self._conn.close()
        if self.end is None:
            self.end = "closed"
        self._lost = (0, time.monotonic() + self._policy.delay(1))
        if self.on_disconnect is not None:
            self.on_disconnect(why)

    def _reconnect(self, deadline: Optional[float]) -> bool:
        """Attempts to connect and subscribe again until it works (True), the
        deadline passes (False, still lost) or it fails for good (False with
        ``_lost`` None, or raises the error another attempt would meet again)."""
        assert self._policy is not None and self._connect is not None and self._lost is not None
        # Bounded by the policy's max_attempts, or by the deadline.
        while self._lost is not None and not self._closed:
            failed, due = self._lost
            now = time.monotonic()
            if due > now:
                if deadline is not None and deadline <= now:
                    return False
                time.sleep(min(due, deadline) - now if deadline is not None else due - now)
                continue
            try:
                conn = self._connect()
            except VaultdClientError as error:
                if not self._retry_after(error, failed):
                    raise
                continue
            try:
                self._subscribe(conn)
            except VaultdClientError as error:
                conn.close()
                if not self._retry_after(error, failed):
                    raise
                continue
            self._conn = conn
            self._lost = None
            self.end = None
            self.reconnections += 1
            if self.on_reconnect is not None:
                self.on_reconnect(self.snapshot)
            return True
        return False

    def _retry_after(self, error: VaultdClientError, failed: int) -> bool:
        """After a failed attempt: schedules the next, or gives up when the
        policy's attempts are spent (the stream ends; True either way), or
        when another attempt would meet the same error (False: raise it)."""
        assert self._policy is not None
        failed += 1
        if isinstance(error, VaultdError):
            self.end = error
        if not _worth_retrying(error):
            self._lost = None
            return False
        if self._policy.max_attempts is not None and failed >= self._policy.max_attempts:
            self._lost = None
            return True
        self._lost = (failed, time.monotonic() + self._policy.delay(failed + 1))
        return True
