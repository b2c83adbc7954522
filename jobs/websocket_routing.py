"""Websocket routes (see DESIGN.md: /ws/jobs/<id>/?since=<seq>)."""
websocket_urlpatterns = []
