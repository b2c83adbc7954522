"""The websocket's messages of lines and metric points (DESIGN.md: the websocket contract), made
in one place: by the follower, which announces what it just stored with the encoded batch, and
by the consumer, which reads what a viewer missed from the database. Both give the same text as
the REST API's serializers (a line's time in the current zone, a point's in UTC; "launcher" for
the launcher's rank).
"""
import json
from datetime import timezone as dt_timezone

from django.utils import timezone


def rank_label(rank):
    return "launcher" if rank is None else rank


def _iso(ts):
    text = ts.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def lines_message(rows):
    """{"type": "lines", ...} for (seq, rank, stream, ts, text) rows in seq order."""
    zone = timezone.get_current_timezone()     # once, not per line (timezone.localtime's lookup)
    return json.dumps({"type": "lines", "lines": [
        {"seq": seq, "rank": rank_label(rank), "stream": stream, "ts": _iso(ts.astimezone(zone)), "text": text}
        for seq, rank, stream, ts, text in rows]})


def metrics_message(points):
    """{"type": "metrics", ...} for (seq, name, rank, step, value, ts) points, or None for none."""
    if not points:
        return None
    return json.dumps({"type": "metrics", "points": [
        {"seq": seq, "name": name, "rank": rank_label(rank), "step": step, "value": value,
         "ts": _iso(ts.astimezone(dt_timezone.utc))}
        for seq, name, rank, step, value, ts in points]})
