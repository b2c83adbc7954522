"""The websocket's messages of lines and metric points (DESIGN.md: the websocket contract), made
in one place: by the follower, which announces what it just stored with the encoded batch, and
by the consumer, which reads what a viewer missed from the database. Both give the same text as
the REST API's serializers (a line's time in the current zone, a point's in UTC; "launcher" for
the launcher's rank).

The text is what json.dumps makes of those dicts, written line by line with json's own C string
encoder: building a dict per line for json.dumps costs three times as much, and the follower
encodes every line it stores (BENCHMARKS.md, ingest).
"""
from datetime import timezone as dt_timezone
from json.encoder import encode_basestring_ascii as _string

from django.utils import timezone

# How the two messages begin (join_lines and join_metrics splice texts made by the functions below).
_LINES_HEAD = '{"type": "lines", "lines": ['
_METRICS_HEAD = '{"type": "metrics", "points": ['


def rank_label(rank):
    return "launcher" if rank is None else rank


def _rank_json(rank):
    return '"launcher"' if rank is None else str(int(rank))


def _iso(ts):
    text = ts.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def lines_message(rows):
    """{"type": "lines", ...} for (seq, rank, stream, ts, text) rows in seq order."""
    zone = timezone.get_current_timezone()     # once, not per line (timezone.localtime's lookup)
    last_ts, iso = None, None
    ranks, streams = {None: _rank_json(None)}, {"stdout": '"stdout"', "stderr": '"stderr"'}
    parts = []
    append = parts.append
    for seq, rank, stream, ts, text in rows:
        if ts is not last_ts and ts != last_ts:     # a batch's lines mostly share their time
            last_ts, iso = ts, _string(_iso(ts.astimezone(zone)))
        # A batch's ranks and streams are few: each one's JSON is made once, not once a line.
        rank_json = ranks.get(rank)
        if rank_json is None:
            rank_json = ranks[rank] = _rank_json(rank)
        append(f'{{"seq": {seq:d}, "rank": {rank_json}, "stream": {streams.get(stream) or _string(stream)}, '
               f'"ts": {iso}, "text": {_string(text)}}}')
    return _LINES_HEAD + ", ".join(parts) + "]}"


def metrics_message(points):
    """{"type": "metrics", ...} for (seq, name, rank, step, value, ts) points, or None for none
    (values are finite floats: runners.output keeps no other)."""
    if not points:
        return None
    last_ts, iso = None, None
    parts = []
    for seq, name, rank, step, value, ts in points:
        if ts != last_ts:
            last_ts, iso = ts, _string(_iso(ts.astimezone(dt_timezone.utc)))
        parts.append('{"seq": %d, "name": %s, "rank": %s, "step": %d, "value": %s, "ts": %s}' % (
            seq, _string(name), _rank_json(rank), step, float.__repr__(float(value)), iso))
    return _METRICS_HEAD + ", ".join(parts) + "]}"


def join_lines(messages):
    """One lines message with the lines of `messages` (lines_message texts, in seq order), made
    by splicing the texts: what a viewer sends for several pushes at once."""
    return _join(_LINES_HEAD, messages)


def join_metrics(messages):
    """One metrics message with the points of `messages` (metrics_message texts or None), or None."""
    return _join(_METRICS_HEAD, [message for message in messages if message])


def _join(head, messages):
    if len(messages) <= 1:
        return messages[0] if messages else None
    bodies = [message[len(head):-2] for message in messages]
    return head + ", ".join(body for body in bodies if body) + "]}"
