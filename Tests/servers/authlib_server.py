#!/usr/bin/env python3
"""A real OAuth 2.0 authorization server for vaultd's tests, built on Authlib.

Not a stand-in: Authlib's own grants and endpoints decide every answer, so a
client that authenticates with another method than the one it is registered
for is refused by Authlib itself (invalid_client). It runs in the venv that
scripts/test makes (Tests/servers/authlib-requirements.txt), on Authlib's
framework-agnostic server classes over Python's http.server.

  --port N        the port on 127.0.0.1 (0: a free one); prints
                  "LISTENING http://127.0.0.1:PORT" once it serves
  --clients FILE  a JSON list of clients: {"client_id", "client_secret"
                  (absent or null for a public client), "method"
                  (token_endpoint_auth_method: client_secret_basic,
                  client_secret_post, private_key_jwt or none),
                  "public_key" (a PEM public key file that checks the
                  client's JWTs) and "key_type" (its kind: RSA or EC), "jwt_bearer" (true: the client
                  may use the JWT bearer grant)}
  --lifetime S    the access tokens' expires_in (default 600)

  POST /token     client_credentials (confidential clients),
                  refresh_token, rotating the refresh token: the old one is
                  revoked when a new one is issued, and the JWT bearer grant
                  (RFC 7523 2.1; iss the client id, aud the server's origin,
                  the token issued to the assertion's sub); private_key_jwt
                  client authentication (RFC 7523 2.2; aud the token URL,
                  each jti once) at /token and /revoke
  POST /revoke    RFC 7009, any of the three methods, each client by its own
  GET  /authorize  the authorization code grant with PKCE, approved as the
                  user POST /control/approve names (authlib_browser.py); the
                  code's exchange at /token by any method
  GET  /resource  200 and the token's user for a live access token
                  (Authorization: Bearer), else 401
  Salesforce's paths as aliases: POST /services/oauth2/token (and the JWT
                  bearer grant's answer has Salesforce's instance_url, the
                  server's origin), GET /services/data/ as /resource
  POST /control/issue  {"client_id": ...}: a token response with a refresh
                  token, as an authorization code login would have given
                  (the token `vaultctl login` is handed); no client auth
  POST /device_authorization, /control/device/...: the device authorization
                  grant (RFC 8628), see authlib_device.py
  --device-interval S, --device-expires-in S: its codes' interval and
                  expires_in (default 5 and 1800)
  GET  /control/stats  every token, revocation and device authorization
                  request so far, each with its time (at, Unix seconds): endpoint,
                  grant_type, status, error, the client it authenticated and
                  the method it did so with, the user a token was issued
                  to, the unverified header and claims of the assertions,
                  a code exchange's code, code_verifier and redirect_uri;
                  which refresh tokens are live
"""

import argparse
import base64
import json
import os
import secrets
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

# Loopback http:// is the tests' transport; Authlib refuses http:// unless told.
os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"

from authlib.oauth2.rfc6749 import (  # noqa: E402
    AuthorizationServer,
    ClientMixin,
    OAuth2Payload,
    OAuth2Request,
    TokenMixin,
    grants,
)
from authlib.oauth2.rfc6750 import BearerTokenGenerator  # noqa: E402
from authlib.oauth2.rfc7009 import RevocationEndpoint  # noqa: E402
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion, JWTBearerGrant  # noqa: E402
from joserfc import jwk  # noqa: E402

import authlib_device  # noqa: E402
import authlib_browser  # noqa: E402

METHODS = ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"]


class Client(ClientMixin):
    def __init__(self, client_id, client_secret, method, public_key=None, jwt_bearer=False):
        self.client_id = client_id
        self.client_secret = client_secret
        self.method = method
        self.public_key = public_key
        self.jwt_bearer = jwt_bearer

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        return scope or ""

    def check_redirect_uri(self, redirect_uri):
        return authlib_browser.loopback_redirect(redirect_uri)

    def check_client_secret(self, client_secret):
        return self.client_secret is not None and secrets.compare_digest(
            self.client_secret.encode(), client_secret.encode())

    def check_endpoint_auth_method(self, method, endpoint):
        # The one method the client is registered for, at every endpoint.
        return method == self.method

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        if grant_type == "client_credentials":
            return self.method != "none"
        if grant_type == JWTBearerGrant.GRANT_TYPE:
            return self.jwt_bearer
        if grant_type in (authlib_device.DEVICE_CODE_GRANT_TYPE, "authorization_code"):
            return True
        return grant_type == "refresh_token"


class Token(TokenMixin):
    def __init__(self, client_id, response, lifetime, user=None):
        self.client_id = client_id
        self.user = user or client_id
        self.access_token = response["access_token"]
        self.refresh_token = response.get("refresh_token")
        self.scope = response.get("scope", "")
        self.issued_at = time.time()
        self.lifetime = lifetime
        self.access_revoked = False
        self.refresh_revoked = False

    def check_client(self, client):
        return client.get_client_id() == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.lifetime

    def is_expired(self):
        return time.time() >= self.issued_at + self.lifetime

    def is_revoked(self):
        return self.access_revoked

    def get_user(self):
        return self.user

    def get_client(self):
        return STATE.clients.get(self.client_id)


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.clients = {}
        self.tokens = []
        self.requests = []
        self.lifetime = 600
        # "http://127.0.0.1:PORT", once the server listens.
        self.origin = None
        self.jtis = set()


STATE = State()


def find_token(value, kind):
    for token in STATE.tokens:
        if kind != "refresh_token" and token.access_token == value:
            return token
        if kind != "access_token" and token.refresh_token == value:
            return token
    return None


class ClientCredentialsGrant(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "private_key_jwt"]


class RefreshTokenGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token):
        token = find_token(refresh_token, "refresh_token")
        if token and not token.refresh_revoked:
            return token
        return None

    def authenticate_user(self, refresh_token):
        return refresh_token.client_id

    def revoke_old_credential(self, refresh_token):
        # Rotation: the refresh token just used works no more.
        refresh_token.refresh_revoked = True


class JWTBearer(JWTBearerGrant):
    """The JWT bearer grant: the assertion's signature is checked with the
    client's public key, its iss must be the client id, its aud the server's
    origin; the token is issued to its sub."""

    def resolve_issuer_client(self, issuer):
        client = STATE.clients.get(issuer)
        return client if client is not None and client.jwt_bearer else None

    def resolve_client_public_key(self, client):
        return client.public_key

    def authenticate_user(self, subject):
        return subject

    def has_granted_permission(self, client, user):
        return True

    def get_audiences(self):
        return [STATE.origin]


class PrivateKeyJWT(JWTBearerClientAssertion):
    """private_key_jwt client authentication: iss and sub the client id, aud
    the token endpoint's URL, signed with the client's key, each jti once."""

    CLIENT_AUTH_METHOD = "private_key_jwt"

    def get_audiences(self):
        return [STATE.origin + "/token"]

    def validate_jti(self, claims, jti):
        if jti in STATE.jtis:
            return False
        STATE.jtis.add(jti)
        return True

    def resolve_client_public_key(self, client):
        if client.public_key is None:
            from authlib.oauth2.rfc6749 import InvalidClientError

            raise InvalidClientError(description="The client has no public key.")
        return client.public_key


def unverified(assertion):
    """The header and claims of a compact JWS, unverified: what vaultd sent."""
    if not assertion:
        return None
    try:
        parts = assertion.split(".")
        decode = lambda part: json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        return {"header": decode(parts[0]), "claims": decode(parts[1]), "signature_bytes":
                len(base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)))}
    except Exception:  # noqa: BLE001 - anything that is no JWS
        return {"malformed": True}


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = METHODS

    def query_token(self, token_string, token_type_hint):
        return find_token(token_string, token_type_hint)

    def revoke_token(self, token, request):
        token.access_revoked = True
        token.refresh_revoked = True


class HTTPRequest:
    """What a handler hands Authlib: the method, URL, headers and form."""

    def __init__(self, handler, form):
        self.handler = handler
        self.form = form
        self.oauth = None


class Payload(OAuth2Payload):
    def __init__(self, form):
        self._data = form

    @property
    def data(self):
        return self._data

    @property
    def datalist(self):
        return {key: [value] for key, value in self._data.items()}


class Request(OAuth2Request):
    def __init__(self, raw):
        super().__init__(raw.handler.command, "http://127.0.0.1" + raw.handler.path, headers=raw.handler.headers)
        self._form = raw.form
        self.payload = Payload(raw.form)

    @property
    def args(self):
        return self._form if self.method == "GET" else {}

    @property
    def form(self):
        return self._form


class Server(AuthorizationServer):
    def query_client(self, client_id):
        return STATE.clients.get(client_id)

    def save_token(self, token, request):
        user = getattr(request, "user", None)
        STATE.tokens.append(Token(request.client.get_client_id(), token, STATE.lifetime, user))

    def create_oauth2_request(self, request):
        if isinstance(request, OAuth2Request):
            return request
        request.oauth = Request(request)
        return request.oauth

    def create_json_request(self, request):
        raise NotImplementedError()

    def handle_response(self, status, body, headers):
        return status, body, headers

    def send_signal(self, name, *args, **kwargs):
        pass


def make_server():
    server = Server()
    server.register_token_generator(
        "default",
        BearerTokenGenerator(
            access_token_generator=lambda **_: "at_" + secrets.token_urlsafe(24),
            refresh_token_generator=lambda **_: "rt_" + secrets.token_urlsafe(24),
            expires_generator=lambda client, grant_type: STATE.lifetime,
        ),
    )
    server.register_grant(ClientCredentialsGrant)
    server.register_grant(RefreshTokenGrant)
    server.register_grant(JWTBearer)
    server.register_client_auth_method("private_key_jwt", PrivateKeyJWT())
    server.register_endpoint(Revocation)
    authlib_browser.register(server, STATE)
    return server


SERVER = None
# Salesforce's paths, so that README's Salesforce example runs here as written
# with only the origin changed: its token endpoint, and its REST API's root as
# a protected resource.
SALESFORCE_TOKEN_PATH = "/services/oauth2/token"
SALESFORCE_RESOURCE_PATH = "/services/data/"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body=None, headers=None):
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        self.send_response(status)
        for name, value in headers or []:
            if name.lower() != "content-length":
                self.send_header(name, value)
        if not any(name.lower() == "content-type" for name, _ in headers or []):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _form(self, raw):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            return {}
        return {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).items()}

    def _oauth(self, endpoint, form):
        raw = HTTPRequest(self, form)
        with STATE.lock:
            if endpoint == "token":
                status, body, headers = SERVER.create_token_response(raw)
            elif endpoint == "device_authorization":
                status, body, headers = SERVER.create_endpoint_response("device_authorization", raw)
            else:
                status, body, headers = SERVER.create_endpoint_response("revocation", raw)
            request = raw.oauth
            client = request.client if request is not None else None
            if status == 200 and form.get("grant_type") == JWTBearerGrant.GRANT_TYPE:
                # Salesforce's token response names the org's own host.
                body["instance_url"] = STATE.origin
            STATE.requests.append({
                "at": time.time(),
                "endpoint": endpoint,
                "grant_type": form.get("grant_type"),
                "status": status,
                "error": body.get("error") if isinstance(body, dict) else None,
                "error_description": body.get("error_description") if isinstance(body, dict) else None,
                "code": form.get("code"),
                "code_verifier": form.get("code_verifier"),
                "redirect_uri": form.get("redirect_uri"),
                "client_id": client.get_client_id() if client else None,
                "auth_method": request.auth_method if request is not None else None,
                "basic": (self.headers.get("Authorization") or "").lower().startswith("basic "),
                "secret_in_body": "client_secret" in form,
                "user": getattr(request, "user", None) if request is not None else None,
                "assertion": unverified(form.get("assertion")),
                "client_assertion": unverified(form.get("client_assertion")),
            })
        self._send(status, body, headers)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in ("/token", SALESFORCE_TOKEN_PATH):
            self._oauth("token", self._form(raw))
        elif self.path == "/revoke":
            self._oauth("revoke", self._form(raw))
        elif self.path == "/device_authorization":
            self._oauth("device_authorization", self._form(raw))
        elif self.path.startswith("/control/device/"):
            answer = authlib_device.control(self.path, json.loads(raw or b"{}"))
            self._send(*(answer or (404, {"error": "not_found"})))
        elif self.path == "/control/approve":
            self._send(200, authlib_browser.control(json.loads(raw or b"{}")))
        elif self.path == "/control/issue":
            client_id = json.loads(raw or b"{}").get("client_id")
            with STATE.lock:
                client = STATE.clients.get(client_id)
                if client is None:
                    self._send(404, {"error": "no such client"})
                    return
                response = SERVER.generate_token("authorization_code", client, user=client_id)
                STATE.tokens.append(Token(client_id, response, STATE.lifetime))
            self._send(200, response)
        else:
            self._send(404, {"error": "not_found"})

    def do_GET(self):
        if self.path.startswith("/control/device/"):
            self._send(*(authlib_device.control(self.path, {}) or (404, {"error": "not_found"})))
        elif self.path.startswith("/authorize?"):
            query = {k: v[0] for k, v in parse_qs(self.path.split("?", 1)[1], keep_blank_values=True).items()}
            with STATE.lock:
                status, body, headers = authlib_browser.authorize(SERVER, HTTPRequest(self, query))
                STATE.requests.append({"endpoint": "authorize", "status": status,
                                       "client_id": query.get("client_id"), "error": None})
            self._send(status, body, headers)
        elif self.path == "/control/stats":
            with STATE.lock:
                live = [t.refresh_token for t in STATE.tokens if t.refresh_token and not t.refresh_revoked]
                body = {"requests": list(STATE.requests), "live_refresh_tokens": live}
            self._send(200, body)
        elif self.path in ("/resource", SALESFORCE_RESOURCE_PATH):
            auth = self.headers.get("Authorization") or ""
            value = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            with STATE.lock:
                token = find_token(value, "access_token") if value else None
                live = token is not None and not token.is_revoked() and not token.is_expired()
                user = token.user if live else None
            self._send(200 if live else 401, {"ok": live, "user": user})
        else:
            self._send(404, {"error": "not_found"})


def main():
    global SERVER
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--clients", required=True)
    parser.add_argument("--lifetime", type=int, default=600)
    parser.add_argument("--device-interval", type=int, default=5)
    parser.add_argument("--device-expires-in", type=int, default=1800)
    args = parser.parse_args()
    with open(args.clients, encoding="utf-8") as file:
        for entry in json.load(file):
            if entry["method"] not in METHODS:
                sys.exit("unknown method %r" % entry["method"])
            public_key = None
            if entry.get("public_key"):
                with open(entry["public_key"], "rb") as key:
                    public_key = jwk.import_key(key.read(), entry["key_type"])
            STATE.clients[entry["client_id"]] = Client(
                entry["client_id"], entry.get("client_secret"), entry["method"], public_key,
                bool(entry.get("jwt_bearer")))
    STATE.lifetime = args.lifetime
    SERVER = make_server()
    authlib_device.register(SERVER, args.device_interval, args.device_expires_in)
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    STATE.origin = "http://127.0.0.1:%d" % httpd.server_address[1]
    authlib_device.DEVICE.origin = STATE.origin
    httpd.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print("LISTENING http://127.0.0.1:%d" % httpd.server_address[1], flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
