"""Websocket authentication: the session cookie (browser) or `Authorization: Token <key>`."""
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import WebsocketDenier
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware

from jobs.web import signin


@database_sync_to_async
def _user_for_token(scope, key):
    """The token's user, through the API's throttled check (a wrong key counts against the
    address; a locked address gets nobody)."""
    request = HttpRequest()
    request.path = request.path_info = scope.get("path", "")
    headers = dict(scope.get("headers", []))
    request.META = {"REMOTE_ADDR": (scope.get("client") or ("", 0))[0],
                    "HTTP_USER_AGENT": headers.get(b"user-agent", b"").decode("latin-1")}
    try:
        return signin.token_user(request, key)
    except signin.Locked:
        return None


class _TokenHeaderMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        value = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, key = value.partition(" ")
        if scheme.lower() == "token":
            # A client that sends a token is who the token says, or nobody: never the session
            # cookie it may carry as well (OriginOrTokenValidator let it through on the token).
            user = await _user_for_token(scope, key.strip()) if key.strip() else None
            scope["user"] = user if user is not None else AnonymousUser()
        return await super().__call__(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner):
    return AuthMiddlewareStack(_TokenHeaderMiddleware(inner))


class _Handshake(HttpRequest):
    """A websocket handshake as Django sees a request: its headers, the server's address, and
    its scheme (https where the connection is wss, or where SECURE_PROXY_SSL_HEADER says so)."""

    def __init__(self, scope):
        super().__init__()
        self._secure = scope.get("scheme") in ("wss", "https")
        server = scope.get("server") or ("", None)
        self.META = {"SERVER_NAME": server[0], "SERVER_PORT": str(server[1] or (443 if self._secure else 80))}
        for name, value in scope.get("headers", []):
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            value = value.decode("latin-1")
            self.META[key] = f"{self.META[key]},{value}" if key in self.META else value

    def _get_scheme(self):
        return "https" if self._secure else "http"


def same_origin(scope):
    """Whether the handshake's Origin is the portal's own (scheme, host and port of the Host the
    browser sent, the host one of ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS: what Django's
    CSRF check accepts from a form posted to the portal."""
    request = _Handshake(scope)
    try:
        return "HTTP_ORIGIN" in request.META and CsrfViewMiddleware(lambda request: None)._origin_verified(request)
    except DisallowedHost:                      # a Host not in ALLOWED_HOSTS: not the portal's origin
        return False


class OriginOrTokenValidator:
    """Browsers always send Origin: it must be the portal's own (same_origin), so that no other
    site, nor another port of the same host, rides the session cookie. A client with no Origin
    header (the CLI, scripts) must use a token."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        token_only = b"origin" not in headers and headers.get(b"authorization", b"").lower().startswith(b"token ")
        if token_only or same_origin(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
