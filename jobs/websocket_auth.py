"""Websocket authentication: the session cookie (browser) or `Authorization: Token <key>`."""
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from rest_framework.authtoken.models import Token


@database_sync_to_async
def _user_for_token(key):
    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token and token.user.is_active else None


class _TokenHeaderMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        value = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, key = value.partition(" ")
        if scheme.lower() == "token" and key.strip():
            user = await _user_for_token(key.strip())
            if user is not None:
                scope["user"] = user
        return await super().__call__(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner):
    return AuthMiddlewareStack(_TokenHeaderMiddleware(inner))
