"""The websocket's lines message is exactly what json.dumps makes of the contract's dicts, for
any text a program can print (the follower and the consumer both send it; viewers parse it)."""
import json
from datetime import datetime, timedelta, timezone as dt_timezone

from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.domain import logwire

START = datetime(2026, 11, 27, 12, 0, tzinfo=dt_timezone.utc)
rows = st.lists(st.tuples(
    st.one_of(st.none(), st.integers(0, 4096)),
    st.sampled_from(["stdout", "stderr"]),
    st.integers(0, 3).map(lambda k: START + timedelta(microseconds=k * 250_001)),   # often shared
    st.text(),                                                                       # surrogates too
), max_size=20)


def expected(rows):
    zone = timezone.get_current_timezone()
    return json.dumps({"type": "lines", "lines": [
        {"seq": seq, "rank": "launcher" if rank is None else rank, "stream": stream,
         "ts": logwire._iso(ts.astimezone(zone)), "text": text}
        for seq, rank, stream, ts, text in rows]})


@settings(max_examples=300, deadline=None)
@given(rows)
def test_the_lines_message_is_the_contracts_json_for_any_text(lines):
    numbered = [(seq, rank, stream, ts, text) for seq, (rank, stream, ts, text) in enumerate(lines, start=7)]
    assert logwire.lines_message(numbered) == expected(numbered)


def test_a_line_in_another_zone_keeps_its_own_time():
    later = START + timedelta(hours=1)
    message = json.loads(logwire.lines_message([(0, 0, "stdout", START, "a"), (1, None, "stderr", later, "b")]))
    assert [line["ts"] for line in message["lines"]] == [
        logwire._iso(START.astimezone(timezone.get_current_timezone())),
        logwire._iso(later.astimezone(timezone.get_current_timezone()))]
    assert message["lines"][1]["rank"] == "launcher"


points = st.lists(st.tuples(
    st.text(min_size=1, max_size=100),
    st.one_of(st.none(), st.integers(0, 4096)),
    st.integers(0, 2**62),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(0, 3).map(lambda k: START + timedelta(microseconds=k * 250_001)),
), max_size=20)


@settings(max_examples=300, deadline=None)
@given(points)
def test_the_metrics_message_is_the_contracts_json_for_any_point(found):
    numbered = [(seq, name, rank, step, value, ts) for seq, (name, rank, step, value, ts) in enumerate(found)]
    assert logwire.metrics_message(numbered) == (json.dumps({"type": "metrics", "points": [
        {"seq": seq, "name": name, "rank": "launcher" if rank is None else rank, "step": step, "value": value,
         "ts": logwire._iso(ts.astimezone(dt_timezone.utc))}
        for seq, name, rank, step, value, ts in numbered]}) if numbered else None)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.lists(points, min_size=1, max_size=5))
def test_pushes_joined_into_one_frame_read_as_one_message_of_all_their_lines_and_points(batches, found):
    """A viewer that was busy while several pushes came sends them as one frame: the same lines
    and points, in order, as one message made from all of them."""
    numbered, seq = [], 0
    for batch in batches:
        numbered.append([(seq + k, rank, stream, ts, text) for k, (rank, stream, ts, text) in enumerate(batch)])
        seq += len(batch)
    everything = [row for batch in numbered for row in batch]
    assert json.loads(logwire.join_lines([logwire.lines_message(b) for b in numbered])) == \
        json.loads(logwire.lines_message(everything))
    made = [[(k, *point) for k, point in enumerate(group)] for group in found]
    joined = logwire.join_metrics([logwire.metrics_message(group) for group in made])
    all_points = [point for group in made for point in group]
    assert (json.loads(joined) if joined else None) == (
        json.loads(logwire.metrics_message(all_points)) if all_points else None)
