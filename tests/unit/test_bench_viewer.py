"""The benchmarks' websocket viewer reads a lines frame without parsing each line (bench/common.py):
what it takes from the frame is what the frame holds, whatever the lines' texts say, so that the
fan-out benchmark's "every line once, in order" and its lags stay true."""
from datetime import datetime, timezone as dt_timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import _frame_of_lines
from jobs.domain import logwire

TS = datetime(2026, 11, 28, 1, 0, tzinfo=dt_timezone.utc)
texts = st.one_of(
    st.text(),
    st.sampled_from(['{"seq": 7, ', '"text": "@1.5 ', '"}, {"seq": 9, "text": "@2 x', "@", "@ x", '\\"']),
    st.floats(1e9, 2e9).map(lambda stamp: f"@{stamp:.6f} n=1 Iter #3"),
)


def frame(first_seq, lines):
    return logwire.lines_message([(first_seq + k, k % 8, "stdout", TS, text) for k, text in enumerate(lines)])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9), st.lists(texts, min_size=1, max_size=30))
def test_the_seqs_and_stamped_lines_of_any_frame(first_seq, lines):
    first, last, count, stamped, _ = _frame_of_lines(frame(first_seq, lines))
    assert (first, last, count) == (first_seq, first_seq + len(lines) - 1, len(lines))
    assert stamped == sum(text.startswith("@") for text in lines)


def test_the_oldest_stamp_is_the_first_stamped_lines():
    lines = ["starting", "@1795828645.076926 n=0 a", "@1795828645.081000 n=1 b"]
    assert _frame_of_lines(frame(40, lines)) == (40, 42, 3, 2, 1795828645.076926)


def test_a_gap_or_a_repeat_inside_a_frame_shows_in_its_span():
    rows = [(seq, 0, "stdout", TS, f"@1795828645.{seq} n") for seq in (5, 6, 8)]
    first, last, count, _, _ = _frame_of_lines(logwire.lines_message(rows))
    assert last - first + 1 != count          # the viewer reads such a frame line by line
    rows = [(seq, 0, "stdout", TS, f"@1795828645.{seq} n") for seq in (5, 6, 6, 7)]
    first, last, count, _, _ = _frame_of_lines(logwire.lines_message(rows))
    assert last - first + 1 != count


def test_a_frame_without_lines():
    assert _frame_of_lines(logwire.lines_message([])) is None
