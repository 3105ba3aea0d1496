"""The authorization code grant with PKCE for authlib_server.py: Authlib's own
AuthorizationCodeGrant with its CodeChallenge(required=True) extension
(RFC 7636), for vaultd's browser login.

  GET  /authorize         the authorization endpoint: validated by Authlib,
                          approved at once as the user the test chose, or
                          denied; answers 302 to the redirect URI with the
                          code and state (or error=access_denied)
  POST /control/approve   {"user": NAME} approves as NAME from now on;
                          {"deny": true} denies

Clients may redirect to http://127.0.0.1 on any port with any path (RFC 8252
7.3: a native app's loopback listener); codes are single use, live 10
minutes and remember their challenge, redirect URI, scope and user.
"""

import re
import secrets
import time

from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc7636 import CodeChallenge

LOOPBACK = re.compile(r"^http://127\.0\.0\.1:[0-9]{1,5}/[^?#]*$")


def loopback_redirect(uri):
    """True for a loopback redirect URI, whatever its port (RFC 8252 7.3)."""
    return bool(uri) and LOOPBACK.match(uri) is not None


class Approval:
    """Who approves the authorizations: a user, or nobody (deny)."""

    def __init__(self):
        self.user = "browser-user"
        self.deny = False


APPROVAL = Approval()


class AuthorizationCode:
    def __init__(self, code, request, user):
        self.code = code
        self.client_id = request.client.get_client_id()
        self.redirect_uri = request.payload.redirect_uri
        self.scope = request.scope or ""
        self.user = user
        self.code_challenge = request.payload.data.get("code_challenge")
        self.code_challenge_method = request.payload.data.get("code_challenge_method")
        self.issued_at = time.time()
        self.used = False

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def is_expired(self):
        return time.time() > self.issued_at + 600


def make_grant(state):
    """Authlib's authorization code grant over `state` (authlib_server's STATE)."""

    class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"]

        def generate_authorization_code(self):
            return "code_" + secrets.token_urlsafe(24)

        def save_authorization_code(self, code, request):
            state.codes[code] = AuthorizationCode(code, request, request.user)

        def query_authorization_code(self, code, client):
            item = state.codes.get(code)
            if item and not item.used and not item.is_expired() and item.client_id == client.get_client_id():
                return item
            return None

        def delete_authorization_code(self, authorization_code):
            # Single use: a code exchanged once is refused from then on.
            authorization_code.used = True

        def authenticate_user(self, authorization_code):
            return authorization_code.user

    return AuthorizationCodeGrant


def register(server, state):
    """Registers the grant, with PKCE required, on `server`."""
    state.codes = {}
    server.register_grant(make_grant(state), [CodeChallenge(required=True)])


def authorize(server, raw):
    """GET /authorize: Authlib validates the request (client, redirect URI,
    response type, challenge) and answers for the approving user."""
    try:
        grant = server.get_consent_grant(raw)
    except Exception as error:  # noqa: BLE001 - Authlib's OAuth2Error, answered as JSON
        status, body, headers = error()
        return status, body, headers
    user = None if APPROVAL.deny else APPROVAL.user
    return server.create_authorization_response(raw.oauth, grant_user=user, grant=grant)


def control(body):
    """POST /control/approve."""
    APPROVAL.deny = bool(body.get("deny"))
    if body.get("user"):
        APPROVAL.user = body["user"]
    return {"user": APPROVAL.user, "deny": APPROVAL.deny}
