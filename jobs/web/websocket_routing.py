"""Websocket routes (see DESIGN.md: /ws/jobs/<id>/?since=<seq>); any other path is refused."""
from channels.generic.websocket import WebsocketConsumer
from django.urls import path, re_path

from jobs.web.consumers import JobConsumer
from jobs.web import params  # noqa: F401  (the <id:...> converter)


class NoSuchPath(WebsocketConsumer):
    """Refuses the handshake (HTTP 403) instead of an error in the server."""

    def connect(self):
        self.close()


websocket_urlpatterns = [
    path("ws/jobs/<id:job_id>/", JobConsumer.as_asgi()),
    re_path(r"", NoSuchPath.as_asgi()),
]
