"""ASGI entry point: Django views over HTTP, Channels consumers over websockets."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from jobs.web.websocket_routing import websocket_urlpatterns  # noqa: E402
from jobs.web.websocket_auth import OriginOrTokenValidator, TokenOrSessionAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files are served by Django itself so `make run` needs no web server in front.
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": OriginOrTokenValidator(
            TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))
        ),
    }
)

from portal.heap import freeze_startup_heap  # noqa: E402

freeze_startup_heap()           # the server's loop stops for no full scan of what start-up made
