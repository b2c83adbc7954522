"""Websocket routes (see DESIGN.md: /ws/jobs/<id>/?since=<seq>)."""
from django.urls import path

from jobs.web.consumers import JobConsumer

websocket_urlpatterns = [path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi())]
