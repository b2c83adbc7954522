"""Websocket authentication: the session cookie (browser) or `Authorization: Token <key>`."""
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest

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


class OriginOrTokenValidator:
    """Browsers always send Origin: it must name an allowed host (no cross-site hijacking of the
    session cookie). A client with no Origin header (the CLI, scripts) must use a token."""

    def __init__(self, application):
        self.application = application
        self.origin_checked = AllowedHostsOriginValidator(application)

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        if b"origin" not in headers and headers.get(b"authorization", b"").lower().startswith(b"token "):
            return await self.application(scope, receive, send)
        return await self.origin_checked(scope, receive, send)
