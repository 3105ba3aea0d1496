"""The device authorization grant (RFC 8628) of the test OAuth 2.0 server
(authlib_server.py), on Authlib's own rfc8628 classes: its
DeviceAuthorizationEndpoint issues the codes and its DeviceCodeGrant decides
every poll (authorization_pending, slow_down, access_denied, expired_token,
the tokens). What the user does at the verification URI is done by the test
through control endpoints.

  POST /device_authorization   RFC 8628 3.1 (client_secret_basic,
                  client_secret_post or none, as the client is registered);
                  expires_in and interval as --device-expires-in and
                  --device-interval say
  POST /control/device/approve {"user_code", "user"}: the user approves
  POST /control/device/deny    {"user_code"}: the user refuses
  POST /control/device/expire  {"user_code"}: the device code expires now
  POST /control/device/slow_down {"user_code"}: the next pending poll is
                  answered slow_down, however slow it came
  GET  /control/device/codes   the user codes issued, oldest first, and the
                  device codes (for the tests' check that none leaks)

A poll that comes sooner than the code's interval after the last one is
answered slow_down (Authlib's should_slow_down), and the code's interval
grows by 5 seconds for every slow_down, as the client's must (RFC 8628 3.5).
"""

import threading
import time

from authlib.oauth2.rfc8628 import (
    DEVICE_CODE_GRANT_TYPE,
    DeviceAuthorizationEndpoint,
    DeviceCodeGrant,
    DeviceCredentialDict,
)


class DeviceState:
    def __init__(self):
        self.lock = threading.Lock()
        self.origin = None
        # device_code -> DeviceCredentialDict
        self.credentials = {}
        # user_code -> (user, approved)
        self.grants = {}
        # device_code -> time.monotonic() of its last poll
        self.last_poll = {}
        # user codes whose next pending poll is answered slow_down
        self.forced_slow_down = set()
        self.user_codes = []


DEVICE = DeviceState()


class Endpoint(DeviceAuthorizationEndpoint):
    def get_verification_uri(self):
        return DEVICE.origin + "/device"

    def save_device_credential(self, client_id, scope, data):
        with DEVICE.lock:
            DEVICE.credentials[data["device_code"]] = DeviceCredentialDict(
                client_id=client_id, scope=scope, expires_at=time.time() + data["expires_in"], **data)
            DEVICE.user_codes.append(data["user_code"])


class Grant(DeviceCodeGrant):
    def query_device_credential(self, device_code):
        return DEVICE.credentials.get(device_code)

    def query_user_grant(self, user_code):
        return DEVICE.grants.get(user_code)

    def should_slow_down(self, credential):
        now = time.monotonic()
        code = credential["device_code"]
        last = DEVICE.last_poll.get(code)
        DEVICE.last_poll[code] = now
        forced = credential["user_code"] in DEVICE.forced_slow_down
        DEVICE.forced_slow_down.discard(credential["user_code"])
        if forced or (last is not None and now - last < credential["interval"]):
            credential["interval"] += 5
            return True
        return False


def register(server, interval, expires_in):
    """Adds the endpoint and the grant to `server`, with these lifetimes."""
    Endpoint.INTERVAL = interval
    Endpoint.EXPIRES_IN = expires_in
    server.register_grant(Grant)
    server.register_endpoint(Endpoint)


def control(path, body):
    """Answers a /control/device/ request: (status, body), or None when the
    path is none of them."""
    actions = {
        "/control/device/approve": lambda code: DEVICE.grants.__setitem__(code, (body.get("user"), True)),
        "/control/device/deny": lambda code: DEVICE.grants.__setitem__(code, (None, False)),
        "/control/device/slow_down": DEVICE.forced_slow_down.add,
        "/control/device/expire": expire,
    }
    if path == "/control/device/codes":
        with DEVICE.lock:
            return 200, {"user_codes": list(DEVICE.user_codes), "device_codes": list(DEVICE.credentials)}
    action = actions.get(path)
    if action is None:
        return None
    code = body.get("user_code")
    with DEVICE.lock:
        if code not in DEVICE.user_codes:
            return 404, {"error": "no such user code"}
        action(code)
    return 200, {}


def expire(user_code):
    for credential in DEVICE.credentials.values():
        if credential["user_code"] == user_code:
            credential["expires_at"] = time.time() - 1
