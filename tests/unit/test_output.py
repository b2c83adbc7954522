"""Unit tests for runners.output (plain pytest, no Django)."""

from __future__ import annotations

import json
import random
from datetime import datetime
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.output import (
    LAUNCHER,
    MAX_LINE_BYTES,
    METRIC_PREFIX,
    Line,
    Metric,
    OutputSplitter,
    extract_metrics,
    first_rank_failure,
    lines_with_metrics,
    parse_rank_failure,
    tag,
    truncation_marker,
)

# Exact bytes observed from horovod's safe_shell_exec with index=2 (reference section 2a).
# The reference wraps the STDOUT string over two lines for display; the bytes are contiguous.
GLOO_OBSERVED_STDOUT = (
    b"[2]<stdout>:hello rank line\n[2]<stdout>:progress 10%\r[2]<stdout>:progress 20%\r"
    b"[2]<stdout>:done\n"
    b"[2]<stdout>:partial-no-newline continued\n[2]<stdout>:crlf line\r[2]<stdout>:\n"
    b"[2]<stdout>:tail without newline"
)
GLOO_OBSERVED_STDERR = b"[2]<stderr>:an error line\n"
GLOO_OBSERVED_TIMESTAMP = b"Sun Nov 22 01:41:09 2026[0]<stdout>:hi\n"

DEFAULT_MARKER = "… [line truncated at 64 KiB]"


def split_all(data: bytes, **kwargs) -> list[Line]:
    """Feed everything at once, then finish."""
    splitter = OutputSplitter(**kwargs)
    return splitter.feed(data) + splitter.finish()


def split_chunks(chunks, **kwargs) -> list[Line]:
    splitter = OutputSplitter(**kwargs)
    lines = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines + splitter.finish()


def texts(lines: list[Line]) -> list[tuple]:
    return [(line.rank, line.stream, line.text) for line in lines]


# --------------------------------------------------------------------------------------------
# Gloo
# --------------------------------------------------------------------------------------------


class TestGloo:
    def test_observed_stdout_feed_returns_terminated_lines(self):
        splitter = OutputSplitter()
        assert texts(splitter.feed(GLOO_OBSERVED_STDOUT)) == [
            (2, "stdout", "hello rank line"),
            (2, "stdout", "done"),
            (2, "stdout", "partial-no-newline continued"),
            (2, "stdout", "crlf line"),
        ]
        assert splitter.finish() == [Line(2, "stdout", "tail without newline", None)]

    def test_observed_stderr(self):
        assert split_all(GLOO_OBSERVED_STDERR) == [Line(2, "stderr", "an error line", None)]

    def test_observed_timestamp_prefix(self):
        assert split_all(GLOO_OBSERVED_TIMESTAMP) == [
            Line(0, "stdout", "hi", datetime(2026, 11, 22, 1, 41, 9))
        ]

    def test_space_padded_day_timestamp(self):
        lines = split_all(b"Mon Jun  2 03:04:05 2025[1]<stderr>:x\n")
        assert lines == [Line(1, "stderr", "x", datetime(2025, 6, 2, 3, 4, 5))]

    def test_timestamp_of_each_record(self):
        data = b"Sun Nov 22 01:41:09 2026[0]<stdout>:a\nSun Nov 22 01:41:10 2026[1]<stdout>:b\n"
        assert [line.ts.second for line in split_all(data)] == [9, 10]

    def test_text_after_colon_is_kept_verbatim(self):
        assert split_all(b"[0]<stdout>:  indented\tx \n")[0].text == "  indented\tx "

    def test_final_unterminated_text_followed_by_other_rank_tag(self):
        data = b"[1]<stdout>:last words[0]<stdout>:next\n[0]<stdout>:more\n"
        splitter = OutputSplitter()
        assert texts(splitter.feed(data)) == [(0, "stdout", "next"), (0, "stdout", "more")]
        assert texts(splitter.finish()) == [(1, "stdout", "last words")]

    def test_empty_record_is_empty_line(self):
        assert split_all(b"[0]<stdout>:\n") == [Line(0, "stdout", "", None)]

    def test_stdout_and_stderr_of_one_rank_are_separate_buffers(self):
        data = b"[0]<stdout>:out-a[0]<stderr>:err\n[0]<stdout>:b\n"
        assert texts(split_all(data)) == [(0, "stderr", "err"), (0, "stdout", "out-ab")]

    def test_multi_digit_rank(self):
        assert texts(split_all(b"[127]<stderr>:x\n")) == [(127, "stderr", "x")]

    def test_64_ranks_interleaved_at_record_granularity(self):
        rng = random.Random(64)
        expected = {rank: [f"rank {rank} line {i} ünï" for i in range(20)] for rank in range(64)}
        cursors = {rank: 0 for rank in range(64)}
        records = []
        while cursors:
            rank = rng.choice(sorted(cursors))
            stream = "stderr" if cursors[rank] % 3 == 0 else "stdout"
            records.append(tag(rank, stream, expected[rank][cursors[rank]]))
            cursors[rank] += 1
            if cursors[rank] == 20:
                del cursors[rank]
        data = b"".join(records)
        cuts = sorted(rng.sample(range(1, len(data)), 300))
        chunks = [data[a:b] for a, b in pairwise([0, *cuts, len(data)])]
        lines = split_chunks(chunks)
        assert len(lines) == 64 * 20
        for rank in range(64):
            own = [line for line in lines if line.rank == rank]
            assert [line.text for line in own] == expected[rank]
            assert [line.stream for line in own] == [
                "stderr" if i % 3 == 0 else "stdout" for i in range(20)
            ]
        assert lines == split_all(data)

    def test_64_ranks_progress_bars_keep_only_final_state(self):
        data = b""
        for step in range(0, 101, 25):
            for rank in range(64):
                data += f"[{rank}]<stderr>:{rank}: {step}%\r".encode()
        data += b"".join(f"[{rank}]<stderr>:\n".encode() for rank in range(64))
        assert texts(split_all(data)) == [(rank, "stderr", f"{rank}: 100%") for rank in range(64)]


# --------------------------------------------------------------------------------------------
# Open MPI
# --------------------------------------------------------------------------------------------


class TestOpenMPI:
    def test_plain_tag(self):
        lines = split_all(b"[1,0]<stdout>:Step #0\tLoss: 2.324532\n")
        assert lines == [Line(0, "stdout", "Step #0\tLoss: 2.324532", None)]

    def test_mid_line_tag_of_same_rank_is_rejoined(self):
        assert split_all(b"[1,0]<stdout>:hel[1,0]<stdout>:lo\n") == [
            Line(0, "stdout", "hello", None)
        ]

    def test_other_rank_chunk_between_halves(self):
        data = b"[1,0]<stdout>:hel[1,1]<stdout>:world\n[1,0]<stdout>:lo\n"
        assert texts(split_all(data)) == [(1, "stdout", "world"), (0, "stdout", "hello")]

    def test_stddiag_maps_to_stderr(self):
        assert texts(split_all(b"[1,3]<stddiag>:diag\n")) == [(3, "stderr", "diag")]

    def test_job_id_is_ignored_rank_is_second_number(self):
        assert texts(split_all(b"[12345,17]<stderr>:x\n")) == [(17, "stderr", "x")]

    def test_timestamp_output(self):
        lines = split_all(b"Sun Nov 22 01:41:09 2026[1,3]<stdout>:x\n")
        assert lines == [Line(3, "stdout", "x", datetime(2026, 11, 22, 1, 41, 9))]

    def test_line_timestamp_is_from_first_tag_of_the_line(self):
        data = b"Sun Nov 22 01:41:09 2026[1,0]<stdout>:aSun Nov 22 01:41:12 2026[1,0]<stdout>:b\n"
        assert split_all(data) == [Line(0, "stdout", "ab", datetime(2026, 11, 22, 1, 41, 9))]

    def test_carriage_return_inside_chunk_stays_with_rank(self):
        # Open MPI does not re-tag at \r, so the text after it still belongs to rank 0.
        assert texts(split_all(b"[1,0]<stderr>:10%\r20%\rdone\n")) == [(0, "stderr", "done")]

    def test_tqdm_style_chunks(self):
        data = b"[1,0]<stderr>:\r 10%[1,0]<stderr>:\r 20%[1,0]<stderr>:\r100%[1,0]<stderr>:\n"
        assert texts(split_all(data)) == [(0, "stderr", "100%")]

    def test_multibyte_character_split_between_chunks(self):
        euro = "€".encode()
        data = b"[1,0]<stdout>:" + euro[:2] + b"[1,0]<stdout>:" + euro[2:] + b"\n"
        assert split_all(data)[0].text == "€"

    def test_untagged_mpirun_help_block(self):
        data = b"----------\nmpirun detected that one or more processes exited\n[1,0]<stdout>:x\n"
        assert texts(split_all(data)) == [
            (LAUNCHER, "stdout", "----------"),
            (LAUNCHER, "stdout", "mpirun detected that one or more processes exited"),
            (0, "stdout", "x"),
        ]


# --------------------------------------------------------------------------------------------
# Untagged text, terminators, order
# --------------------------------------------------------------------------------------------


class TestTerminatorsAndLauncher:
    def test_untagged_lines_are_launcher_stdout(self):
        data = b"Process 1 exit with status code 3.\nTraceback (most recent call last):\n"
        assert split_all(data) == [
            Line(None, "stdout", "Process 1 exit with status code 3.", None),
            Line(None, "stdout", "Traceback (most recent call last):", None),
        ]

    def test_progress_bar_yields_only_last_state(self):
        data = b"[2]<stdout>:progress 10%\r[2]<stdout>:progress 20%\r[2]<stdout>:done\n"
        assert split_all(data) == [Line(2, "stdout", "done", None)]

    def test_gloo_crlf_yields_carriage_text(self):
        assert split_all(b"[2]<stdout>:crlf line\r[2]<stdout>:\n") == [
            Line(2, "stdout", "crlf line", None)
        ]

    def test_bare_untagged_crlf(self):
        assert split_all(b"a\r\n") == [Line(None, "stdout", "a", None)]

    def test_carriage_pending_at_finish_is_emitted(self):
        splitter = OutputSplitter()
        assert splitter.feed(b"[0]<stdout>:50%\r") == []
        assert splitter.finish() == [Line(0, "stdout", "50%", None)]

    def test_newer_partial_text_wins_over_carriage_at_finish(self):
        assert texts(split_all(b"[0]<stdout>:50%\r[0]<stdout>:60")) == [(0, "stdout", "60")]

    def test_empty_carriage_return_keeps_previous_state(self):
        assert texts(split_all(b"[0]<stdout>:done\r[0]<stdout>:\r[0]<stdout>:\n")) == [
            (0, "stdout", "done")
        ]

    def test_carriage_timestamp_is_kept_for_crlf(self):
        data = b"Sun Nov 22 01:41:09 2026[0]<stdout>:x\rSun Nov 22 01:41:10 2026[0]<stdout>:\n"
        assert split_all(data)[0].ts == datetime(2026, 11, 22, 1, 41, 9)

    def test_launcher_text_after_gloo_carriage_return_is_launcher(self):
        data = b"[1]<stdout>:50%\rProcess 1 exit with status code 3.\n"
        assert texts(split_all(data)) == [
            (None, "stdout", "Process 1 exit with status code 3."),
            (1, "stdout", "50%"),
        ]

    def test_untagged_text_before_a_tag_stays_pending_for_launcher(self):
        data = b"launcher says [0]<stdout>:rank text\nhello\n"
        assert texts(split_all(data)) == [
            (0, "stdout", "rank text"),
            (None, "stdout", "launcher says hello"),
        ]

    def test_lines_returned_in_terminator_order(self):
        data = b"[0]<stdout>:a[1]<stdout>:b[2]<stdout>:c\n[1]<stdout>:\n[0]<stdout>:\n"
        assert texts(split_all(data)) == [
            (2, "stdout", "c"),
            (1, "stdout", "b"),
            (0, "stdout", "a"),
        ]

    def test_finish_flushes_in_start_order(self):
        data = b"[3]<stdout>:x[1]<stderr>:y[3]<stdout>:z"
        assert texts(split_all(data)) == [(3, "stdout", "xz"), (1, "stderr", "y")]

    def test_blank_untagged_lines(self):
        assert texts(split_all(b"\n\n")) == [(None, "stdout", ""), (None, "stdout", "")]

    def test_finish_with_nothing_pending(self):
        splitter = OutputSplitter()
        assert splitter.feed(b"[0]<stdout>:x\n") == [Line(0, "stdout", "x", None)]
        assert splitter.finish() == []

    def test_splitter_usable_after_finish(self):
        splitter = OutputSplitter()
        splitter.feed(b"[0]<stdout>:first")
        assert texts(splitter.finish()) == [(0, "stdout", "first")]
        assert texts(splitter.feed(b"second\n")) == [(None, "stdout", "second")]

    def test_lookalike_tags_are_text(self):
        data = b"[a]<stdout>:x\n[0]<stdin>:y\n[0] <stdout>:z\n"
        assert texts(split_all(data)) == [
            (None, "stdout", "[a]<stdout>:x"),
            (None, "stdout", "[0]<stdin>:y"),
            (None, "stdout", "[0] <stdout>:z"),
        ]

    def test_invalid_date_in_timestamp_gives_no_ts(self):
        lines = split_all(b"Mon Feb 30 01:02:03 2026[0]<stdout>:x\n")
        assert lines == [Line(0, "stdout", "x", None)]


# --------------------------------------------------------------------------------------------
# Chunking and UTF-8
# --------------------------------------------------------------------------------------------


class TestChunking:
    def test_tag_split_across_two_feeds_at_every_position(self):
        data = b"Sun Nov 22 01:41:09 2026[12]<stderr>:hi\n[1,5]<stddiag>:there\n"
        expected = split_all(data)
        assert texts(expected) == [(12, "stderr", "hi"), (5, "stderr", "there")]
        for cut in range(len(data) + 1):
            assert split_chunks([data[:cut], data[cut:]]) == expected, cut

    def test_longest_possible_tag_split_at_every_position(self):
        longest = b"Wed Sep  22 01:41:09 2026[123456789,987654321]<stddiag>:"
        data = b"text before " * 8 + longest + b"after\n"
        expected = split_all(data)
        assert expected == [
            Line(987654321, "stderr", "after", datetime(2026, 9, 22, 1, 41, 9)),
            Line(None, "stdout", "text before " * 8, None),
        ]
        for cut in range(len(data) + 1):
            assert split_chunks([data[:cut], data[cut:]]) == expected, cut

    def test_byte_at_a_time_equals_one_shot(self):
        data = GLOO_OBSERVED_STDOUT + GLOO_OBSERVED_STDERR + GLOO_OBSERVED_TIMESTAMP
        one_byte_chunks = [data[i : i + 1] for i in range(len(data))]
        assert split_chunks(one_byte_chunks) == split_all(data)

    def test_line_split_across_feeds_is_rejoined(self):
        splitter = OutputSplitter()
        assert splitter.feed(b"[0]<stdout>:hel") == []
        assert splitter.feed(b"lo wor") == []
        assert splitter.feed(b"ld\n") == [Line(0, "stdout", "hello world", None)]

    def test_multibyte_character_split_across_feeds(self):
        data = "[0]<stdout>:naïve 日本 🙂\n".encode()
        for cut in range(len(data) + 1):
            assert split_chunks([data[:cut], data[cut:]])[0].text == "naïve 日本 🙂"

    def test_invalid_utf8_is_replaced(self):
        lines = split_all(b"[0]<stdout>:bad \xff\xfe bytes\n\xc3\x28\n")
        assert lines == [
            Line(0, "stdout", "bad \ufffd\ufffd bytes", None),
            Line(None, "stdout", "\ufffd(", None),
        ]

    def test_incomplete_utf8_at_eof_is_replaced(self):
        assert split_all(b"[0]<stdout>:x\xe2\x82")[0].text == "x\ufffd"

    def test_feed_accepts_bytearray_and_memoryview(self):
        splitter = OutputSplitter()
        assert splitter.feed(bytearray(b"[0]<stdout>:a\n")) == [Line(0, "stdout", "a", None)]
        assert splitter.feed(memoryview(b"[0]<stdout>:b\n")) == [Line(0, "stdout", "b", None)]


# --------------------------------------------------------------------------------------------
# Truncation
# --------------------------------------------------------------------------------------------


class TestTruncation:
    def test_default_marker(self):
        assert truncation_marker(MAX_LINE_BYTES) == DEFAULT_MARKER
        assert truncation_marker(1024) == "… [line truncated at 1 KiB]"
        assert truncation_marker(1000) == "… [line truncated at 1000 bytes]"

    def test_default_limit_truncates_long_line(self):
        long_text = b"x" * (MAX_LINE_BYTES + 5000)
        lines = split_all(b"[0]<stdout>:" + long_text + b"\n[0]<stdout>:next\n")
        assert lines[0].text == "x" * MAX_LINE_BYTES + DEFAULT_MARKER
        assert lines[1] == Line(0, "stdout", "next", None)

    def test_line_of_exactly_the_limit_is_kept(self):
        assert split_all(b"[0]<stdout>:" + b"y" * 16 + b"\n", max_line_bytes=16)[0].text == "y" * 16

    def test_one_byte_over_the_limit_is_truncated(self):
        lines = split_all(b"[0]<stdout>:" + b"y" * 17 + b"\n", max_line_bytes=16)
        assert lines[0].text == "y" * 16 + truncation_marker(16)

    def test_rest_of_line_dropped_until_terminator_across_tags_and_feeds(self):
        chunks = [
            b"[1,0]<stdout>:" + b"a" * 10,
            b"[1,0]<stdout>:" + b"b" * 10,
            b"c" * 50 + b"\nok\n",
        ]
        assert texts(split_chunks(chunks, max_line_bytes=16)) == [
            (0, "stdout", "a" * 10 + "b" * 6 + truncation_marker(16)),
            (None, "stdout", "ok"),
        ]

    @pytest.mark.parametrize("prefix_len", range(0, 8))
    def test_cut_never_splits_a_utf8_character(self, prefix_len):
        text = "a" * prefix_len + "🙂" * 10  # 4-byte characters
        line = split_all(tag(0, "stdout", text), max_line_bytes=16)[0]
        kept = line.text[: -len(truncation_marker(16))]
        assert "\ufffd" not in kept
        assert text.startswith(kept)
        assert 16 - 3 <= len(kept.encode()) <= 16

    def test_truncated_progress_state(self):
        data = b"[0]<stdout>:" + b"p" * 40 + b"\r[0]<stdout>:\n"
        assert split_all(data, max_line_bytes=16)[0].text == "p" * 16 + truncation_marker(16)

    def test_truncated_line_pending_at_finish(self):
        lines = split_all(b"[0]<stdout>:" + b"z" * 40, max_line_bytes=16)
        assert lines == [Line(0, "stdout", "z" * 16 + truncation_marker(16), None)]

    def test_memory_stays_bounded_for_endless_line(self):
        splitter = OutputSplitter(max_line_bytes=1024)
        splitter.feed(b"[0]<stdout>:")
        for _ in range(1000):
            assert splitter.feed(b"q" * 1000) == []
        state = splitter.state()
        assert len(json.dumps(state)) < 4 * 1024
        assert splitter.feed(b"\n")[0].text == "q" * 1024 + truncation_marker(1024)

    def test_memory_stays_bounded_for_endless_untagged_line(self):
        splitter = OutputSplitter(max_line_bytes=1024)
        for _ in range(1000):
            splitter.feed(b"[" * 1000)
        assert len(json.dumps(splitter.state())) < 4 * 1024

    def test_invalid_limit_rejected(self):
        with pytest.raises(ValueError):
            OutputSplitter(max_line_bytes=0)


# --------------------------------------------------------------------------------------------
# State snapshot / restore
# --------------------------------------------------------------------------------------------


def restore(splitter: OutputSplitter) -> OutputSplitter:
    """Snapshot through JSON text, as the caller stores it in the database."""
    return OutputSplitter(state=json.loads(json.dumps(splitter.state())))


class TestState:
    def test_state_is_json_serialisable_with_pending_everything(self):
        splitter = OutputSplitter()
        splitter.feed(
            b"Sun Nov 22 01:41:09 2026[1,0]<stdout>:caf\xc3[0]<stderr>:10%\r[1]<stdout>:x[1,"
        )
        state = splitter.state()
        assert json.loads(json.dumps(state)) == state

    @pytest.mark.parametrize("cut", range(0, len(GLOO_OBSERVED_STDOUT) + 1, 7))
    def test_restore_continues_observed_stream(self, cut):
        first = OutputSplitter()
        lines = first.feed(GLOO_OBSERVED_STDOUT[:cut])
        second = restore(first)
        lines += second.feed(GLOO_OBSERVED_STDOUT[cut:]) + second.finish()
        assert lines == split_all(GLOO_OBSERVED_STDOUT)

    def test_restore_mid_timestamp_tag_and_carriage(self):
        data = (
            b"[1,2]<stderr>:a\rb[0]<stdout>:x\r"
            b"Sun Nov 22 01:41:09 2026[0]<stdout>:\n[1,2]<stderr>:\n"
        )
        cut = data.index(b"01:41")
        first = OutputSplitter()
        lines = first.feed(data[:cut])
        second = restore(first)
        lines += second.feed(data[cut:]) + second.finish()
        assert lines == split_all(data)
        assert texts(lines) == [(0, "stdout", "x"), (2, "stderr", "b")]

    def test_restore_keeps_line_limit(self):
        first = OutputSplitter(max_line_bytes=16)
        first.feed(b"[0]<stdout>:" + b"a" * 10)
        second = OutputSplitter(state=first.state())
        assert second.feed(b"b" * 10 + b"\n")[0].text == "a" * 10 + "b" * 6 + truncation_marker(16)

    def test_fresh_state_roundtrip(self):
        splitter = restore(OutputSplitter())
        assert splitter.feed(b"[0]<stdout>:x\n") == [Line(0, "stdout", "x", None)]

    def test_snapshot_does_not_alias_live_state(self):
        splitter = OutputSplitter()
        splitter.feed(b"[0]<stdout>:abc")
        state = splitter.state()
        splitter.feed(b"def")
        assert OutputSplitter(state=state).finish() == [Line(0, "stdout", "abc", None)]

    def test_finish_clears_state(self):
        splitter = OutputSplitter()
        splitter.feed(b"[0]<stdout>:abc[1,")
        splitter.finish()
        assert splitter.state() == OutputSplitter().state()

    def test_unknown_state_version_rejected(self):
        state = OutputSplitter().state()
        state["version"] = 999
        with pytest.raises(ValueError):
            OutputSplitter(state=state)


# Fragments mixing every format, chosen so random sequences hit tags split mid-way, mid-line
# tags, carriage returns, multi-byte and invalid UTF-8 and lines longer than the limit.
FRAGMENTS = [
    b"[0]<stdout>:",
    b"[1]<stderr>:",
    b"[63]<stdout>:",
    b"[1,0]<stdout>:",
    b"[1,1]<stddiag>:",
    b"[1,12]<stderr>:",
    b"Sun Nov 22 01:41:09 2026[0]<stdout>:",
    b"Mon Jun  2 03:04:05 2025[1,3]<stderr>:",
    b"Sun Nov 22 01:41:09 2026",
    b"[",
    b"]<",
    b"\n",
    b"\r",
    b"\r\n",
    b"hello",
    b"progress 42%",
    b" ",
    "€🙂ü".encode(),
    b"\xe2\x82",
    b"\xff",
    b"x" * 20,
    b"Process 1 exit with status code 3.",
]


@st.composite
def stream_and_cuts(draw):
    parts = draw(st.lists(st.sampled_from(FRAGMENTS), max_size=60))
    extra = draw(st.binary(max_size=20))
    data = b"".join(parts) + extra
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    snapshot_at = draw(st.integers(0, len(cuts)))
    max_line_bytes = draw(st.sampled_from([8, 16, 40, MAX_LINE_BYTES]))
    return data, cuts, snapshot_at, max_line_bytes


@settings(max_examples=400, deadline=None)
@given(stream_and_cuts())
def test_property_chunking_and_snapshot_restore_match_one_shot(case):
    data, cuts, snapshot_at, max_line_bytes = case
    expected = split_all(data, max_line_bytes=max_line_bytes)

    chunks = [data[a:b] for a, b in pairwise([0, *cuts, len(data)])]
    splitter = OutputSplitter(max_line_bytes=max_line_bytes)
    lines = []
    for index, chunk in enumerate(chunks):
        if index == snapshot_at:
            splitter = OutputSplitter(state=json.loads(json.dumps(splitter.state())))
        lines += splitter.feed(chunk)
    lines += splitter.finish()
    assert lines == expected


class GeneralSplitter(OutputSplitter):
    """The splitter without its fast path for whole Gloo records: the reference it must match."""

    _fast_path = False


class SmallRunsSplitter(OutputSplitter):
    """The splitter taking runs of records at once from a few bytes on (by default only from
    2 KiB): so that this file's small inputs go that way too."""

    _run_first_bytes, _run_most_bytes, _run_least_bytes = 24, 96, 1


def split_general(chunks, splitter_class=GeneralSplitter, **kwargs) -> list[Line]:
    splitter = splitter_class(**kwargs)
    lines = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines + splitter.finish()


RECORDS = [tag(0, "stdout", "step 1 loss 0.5"), tag(1, "stderr", "warn [x]<y"), tag(2, "stdout", ""),
           tag(3, "stdout", "x" * 50), b"[4]<stdout>:crlf\r[4]<stdout>:\n", b"[5]<stdout>:half",
           b"[6]<stdout>:a[7]<stdout>:b\n", b"[1,8]<stdout>:mpi\n", b"[0]<stddiag>:diag\n",
           b"Sun Nov 22 01:41:09 2026[9]<stdout>:stamped\n", b"launcher says\n", b"\r", b"\n",
           # what a run of whole records taken at once must decode and measure as the loop does
           tag(0, "stdout", "ü€🙂 wide"), b"[2]<stdout>:bad \xff\xe2\x82 bytes\n", b"[3]<stderr>:a>:b <x]\n",
           b"[4]<stdout>:\xe2\x82\n", tag(5, "stdout", "é" * 9), tag(6, "stderr", "y" * 17), b"[0012]<stdout>:lead\n",
           b"[7]<stdout\n", b"[8]<stderr>\n", b"[9]<stdout>:" + "\u0663".encode() + b"\n"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(RECORDS + FRAGMENTS), max_size=60), st.lists(st.integers(0, 3000), max_size=8),
       st.sampled_from([8, 16, 40, MAX_LINE_BYTES]))
def test_property_the_fast_path_gives_exactly_the_lines_of_the_general_way(parts, cuts, max_line_bytes):
    data = b"".join(parts)
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    chunks = [data[a:b] for a, b in pairwise(bounds)]
    expected = split_general(chunks, max_line_bytes=max_line_bytes)
    assert split_chunks(chunks, max_line_bytes=max_line_bytes) == expected
    assert split_general(chunks, SmallRunsSplitter, max_line_bytes=max_line_bytes) == expected
    assert split_all(data, max_line_bytes=max_line_bytes) == split_general([data], max_line_bytes=max_line_bytes)
    assert split_general([data], SmallRunsSplitter, max_line_bytes=max_line_bytes) == \
        split_general([data], max_line_bytes=max_line_bytes)


def test_a_long_output_of_whole_records_is_taken_in_runs_as_the_general_way_reads_it():
    """Runs (_records_at_once) of 64 KiB and more, each feed's stopped by one of: a tag in a
    text, a launcher line, a \\r, a line over the limit; taken up again at the next feed."""
    records = [tag(rank % 64, ("stdout", "stderr")[rank % 2], f"step {rank} loss 0.{rank} ü") for rank in range(12000)]
    records[500] = b"[20]<stdout>:bad \xff\xe2\x82 bytes\n"
    records[1000] = tag(3, "stderr", "a [4]<stdout>: inside")      # rank 3's next record ends its "a "
    records[4000] = b"launcher line\n"
    records[7000] = b"[5]<stdout>:half\r[5]<stdout>:done\n"
    records[10000] = tag(6, "stdout", "z" * 70000)
    data = b"".join(records)
    cuts = [sum(map(len, records[:index])) + 5 for index in (2500, 5500, 8500)]
    chunks = [data[a:b] for a, b in pairwise([0, *cuts, len(data)])]
    lines = split_chunks(chunks)
    assert lines == split_general(chunks)
    assert lines[:500] == [Line(rank % 64, ("stdout", "stderr")[rank % 2], f"step {rank} loss 0.{rank} ü", None)
                           for rank in range(500)]
    assert lines[500] == Line(20, "stdout", "bad \ufffd\ufffd bytes", None)
    assert Line(None, "stdout", "launcher line", None) in lines and Line(5, "stdout", "done", None) in lines
    assert Line(3, "stderr", "a step 1027 loss 0.1027 ü", None) in lines
    assert lines[-1] == Line(11999 % 64, "stderr", "step 11999 loss 0.11999 ü", None)


def test_a_rank_with_text_pending_ends_it_before_its_next_whole_record():
    splitter = OutputSplitter()
    splitter.feed(b"[1]<stdout>:unfinished")             # rank 1 has text pending
    lines = splitter.feed(b"\n[0]<stdout>:a\n[1]<stdout>:b\n[0]<stderr>:" + b"y" * 10 + b"\n")
    assert [(line.rank, line.stream, line.text) for line in lines] == [
        (1, "stdout", "unfinished"), (0, "stdout", "a"), (1, "stdout", "b"), (0, "stderr", "y" * 10)]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 64))
def test_property_arbitrary_bytes_never_raise_and_lines_are_clean(data, max_line_bytes):
    lines = split_all(data, max_line_bytes=max_line_bytes)
    marker = truncation_marker(max_line_bytes)
    for line in lines:
        assert "\n" not in line.text and "\r" not in line.text
        assert line.stream in ("stdout", "stderr")
        body = line.text[: -len(marker)] if line.text.endswith(marker) else line.text
        assert len(body.encode("utf-8", errors="surrogatepass")) <= 3 * max_line_bytes


# --------------------------------------------------------------------------------------------
# tag() fixture helper
# --------------------------------------------------------------------------------------------


def test_tag_builds_gloo_record():
    assert tag(3, "stderr", "boom") == b"[3]<stderr>:boom\n"
    assert tag(0, "stdout", "ü") == "[0]<stdout>:ü\n".encode()
    assert split_all(tag(5, "stdout", "hi")) == [Line(5, "stdout", "hi", None)]


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


class TestRingmasterMetric:
    def test_example_line(self):
        text = 'RINGMASTER_METRIC {"step": 10, "loss": 0.31, "img_per_sec": 812}'
        assert extract_metrics(text) == [
            Metric("loss", 0.31, 10),
            Metric("img_per_sec", 812.0, 10),
        ]
        assert all(isinstance(m.value, float) for m in extract_metrics(text))

    def test_prefix_constant(self):
        assert METRIC_PREFIX == "RINGMASTER_METRIC "

    def test_without_step(self):
        assert extract_metrics('RINGMASTER_METRIC {"acc": 0.9}') == [Metric("acc", 0.9, None)]

    @pytest.mark.parametrize("step", ["-1", "1.5", "true", '"10"', "null"])
    def test_invalid_step_becomes_none(self, step):
        assert extract_metrics(f'RINGMASTER_METRIC {{"step": {step}, "loss": 1}}') == [
            Metric("loss", 1.0, None)
        ]

    def test_step_zero(self):
        assert extract_metrics('RINGMASTER_METRIC {"step": 0, "loss": 2}') == [
            Metric("loss", 2.0, 0)
        ]

    def test_non_numeric_values_skipped(self):
        text = METRIC_PREFIX + json.dumps(
            {"step": 1, "ok": True, "name": "x", "l": [1], "d": {}, "n": None, "v": -2.5}
        )
        assert extract_metrics(text) == [Metric("v", -2.5, 1)]

    def test_non_finite_values_skipped(self):
        text = 'RINGMASTER_METRIC {"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e999, "e": 3}'
        assert extract_metrics(text) == [Metric("e", 3.0, None)]

    def test_huge_int_skipped(self):
        assert extract_metrics('RINGMASTER_METRIC {"a": ' + "9" * 400 + ', "b": 1}') == [
            Metric("b", 1.0, None)
        ]

    @pytest.mark.parametrize(
        "payload",
        ["", "{", "not json", "[1, 2]", "42", '"s"', '{"step": 3}', '{"a": "1"}', "{} trailing"],
    )
    def test_invalid_or_empty_payload(self, payload):
        assert extract_metrics(METRIC_PREFIX + payload) == []

    def test_deeply_nested_json_does_not_raise(self):
        assert extract_metrics(METRIC_PREFIX + "[" * 100000 + "]" * 100000) == []

    def test_name_length_limit(self):
        ok, too_long = "n" * 100, "m" * 101
        text = METRIC_PREFIX + json.dumps({ok: 1, too_long: 2, "": 3})
        assert extract_metrics(text) == [Metric(ok, 1.0, None)]

    def test_prefix_after_logging_prefix(self):
        assert extract_metrics('INFO:train: RINGMASTER_METRIC {"loss": 1.5}') == [
            Metric("loss", 1.5, None)
        ]

    def test_prefix_without_space_is_not_a_metric(self):
        assert extract_metrics('RINGMASTER_METRIC{"loss": 1.5}') == []


class TestHorovodExampleMetrics:
    @pytest.mark.parametrize("device", ["GPU", "CPU"])
    def test_benchmark_iteration(self, device):
        assert extract_metrics(f"Iter #3: 812.4 img/sec per {device}") == [
            Metric("img_per_sec", 812.4, 3)
        ]

    def test_benchmark_mean(self):
        assert extract_metrics("Img/sec per GPU: 812.3 +-12.1") == [
            Metric("img_per_sec_mean", 812.3, None)
        ]

    def test_benchmark_total(self):
        assert extract_metrics("Total img/sec on 2 GPU(s): 1624.6 +-24.2") == [
            Metric("total_img_per_sec", 1624.6, None)
        ]
        assert extract_metrics("Total img/sec on 4 CPU(s): 40.0 +-2.0") == [
            Metric("total_img_per_sec", 40.0, None)
        ]

    @pytest.mark.parametrize(
        "text",
        ["Model: resnet50", "Batch size: 32", "Number of GPUs: 2", "Running benchmark...", ""],
    )
    def test_benchmark_other_lines(self, text):
        assert extract_metrics(text) == []

    def test_mnist_train(self):
        assert extract_metrics("Train Epoch: 2 [640/30000 (2%)]\tLoss: 0.301234") == [
            Metric("loss", 0.301234, (2 - 1) * 30000 + 640)
        ]

    def test_mnist_train_first_epoch_and_loss_scale(self):
        text = "Train Epoch: 1 [0/30000 (0%)]\tLoss: 2.302585\tLoss Scale: 65536.0"
        assert extract_metrics(text) == [Metric("loss", 2.302585, 0)]

    def test_mnist_train_nan_loss_skipped(self):
        assert extract_metrics("Train Epoch: 1 [0/30000 (0%)]\tLoss: nan") == []

    def test_mnist_test(self):
        assert extract_metrics("Test set: Average loss: 0.0512, Accuracy: 98.31%") == [
            Metric("test_loss", 0.0512, None),
            Metric("test_accuracy", 98.31, None),
        ]

    def test_metrics_from_split_lines(self):
        data = b"[1,0]<stdout>:Iter #0: 100.5 img/s[1,0]<stdout>:ec per GPU\n"
        (line,) = split_all(data)
        assert extract_metrics(line.text) == [Metric("img_per_sec", 100.5, 0)]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_property_extract_metrics_never_raises(text):
    for candidate in (text, METRIC_PREFIX + text, "Train Epoch: " + text, "Iter #" + text):
        for metric in extract_metrics(candidate):
            assert isinstance(metric.value, float)
            assert metric.step is None or metric.step >= 0


# Lines that hold a metric, or come close: what a follower's batch is made of.
_METRIC_LIKE = st.one_of(
    st.text(max_size=60),
    st.builds(lambda head, value: f'{head}RINGMASTER_METRIC {{"step": 3, "loss": {value}}}',
              st.sampled_from(["", "INFO: ", "RINGMASTER_METRIC"]), st.floats(allow_nan=False, allow_infinity=False)),
    st.builds("Iter #{}: {} img/sec per GPU".format, st.integers(0, 99), st.floats(0, 1e4)),
    st.sampled_from(["Img/sec per CPU: 5.0 +-1.0", "Total img/sec on 2 GPU(s): 9.5 +-0.5",
                     "Train Epoch: 2 [640/30000 (2%)]\tLoss: 0.3", "Test set: Average loss: 0.1, Accuracy: 98.0%",
                     "  Test set: Average loss: 0.1, Accuracy: 98.0%\n", "img/se", "Train Epoc", "RINGMASTER_METRIC"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_METRIC_LIKE, max_size=30))
def test_property_lines_with_metrics_leaves_out_only_lines_without_one(texts):
    """A follower extracts metrics only from the lines lines_with_metrics names: it must name
    every line in which extract_metrics finds one."""
    named = lines_with_metrics(texts)
    assert named == sorted(set(named))
    assert [index for index, text in enumerate(texts) if extract_metrics(text)] == \
        [index for index in named if extract_metrics(texts[index])]


# --------------------------------------------------------------------------------------------
# Rank failure
# --------------------------------------------------------------------------------------------


class TestParseRankFailure:
    def test_launcher_line(self):
        assert parse_rank_failure("Process 1 exit with status code 3.") == (1, 3)

    def test_signal_code_and_whitespace(self):
        assert parse_rank_failure("  Process 12 exit with status code 143.  ") == (12, 143)

    def test_mpirun_rank_killed_by_a_signal(self):
        line = ("mpirun noticed that process rank 3 with PID 0 on node rm-job-7-worker-1.rm-job-7.team.svc "
                "exited on signal 9 (Killed).")
        assert parse_rank_failure(line) == (3, 137)

    @pytest.mark.parametrize(
        "text",
        [
            "Terminating remaining workers after failure of Process 1.",
            "Process 1 exit with status code 3",
            "Process x exit with status code 3.",
            "[0]<stdout>:Process 1 exit with status code 3.",
            "",
        ],
    )
    def test_other_lines(self, text):
        assert parse_rank_failure(text) is None


# --- what a failing rank said (runners.output.exception_line and friends) --------------------
from runners.output import exception_line, exception_name, is_secondary, signal_exit  # noqa: E402

CHAINED = """\
  File "train.py", line 9, in <module>
    hvd.allreduce(x)
RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "train.py", line 11, in <module>
    raise HorovodInternalError(e)
horovod.common.exceptions.HorovodInternalError: Horovod has been shut down.
after the traceback
SomethingElse: not part of it""".splitlines()


def test_the_exception_a_traceback_ends_with_even_when_chained():
    assert exception_line(['  File "t.py", line 6, in <module>', '    raise RuntimeError("boom")',
                           "RuntimeError: boom", "more output"]) == "RuntimeError: boom"
    assert exception_line(CHAINED) == "horovod.common.exceptions.HorovodInternalError: Horovod has been shut down."
    assert exception_line(['  File "t.py", line 6, in <module>', "KeyboardInterrupt"]) == "KeyboardInterrupt"
    assert exception_line(['  File "t.py", line 6, in <module>']) is None          # not ended yet


def test_which_errors_only_say_that_another_rank_failed_first():
    line = exception_line(CHAINED)
    assert exception_name(line) == "HorovodInternalError" and is_secondary(line)
    assert not is_secondary("RuntimeError: boom")


def test_exit_statuses_that_are_signals():
    assert signal_exit(137) == ("killed by signal 9 (SIGKILL; the kernel's out-of-memory killer sends it when "
                                "memory runs out)")
    assert signal_exit(-15) == "killed by signal 15 (SIGTERM)"
    assert signal_exit(1) is None and signal_exit(None) is None and signal_exit(128) is None


# What torchrun 2.13 printed for a job whose rank 1 raised while rank 0 was killed (its error
# summary, from the workers' error files); the root cause is the first failure they recorded.
TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ringmaster_rank FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_07:13:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_07:13:54
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 8)
  error_file: /tmp/torchelastic_iha__zia/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    ZeroDivisionError: boom on purpose
============================================================"""


def test_the_first_failure_is_torchruns_root_cause_not_the_first_failure_it_lists():
    assert first_rank_failure(TORCHRUN_SUMMARY.splitlines()) == (1, 1)


def test_the_first_failure_of_horovodrun_is_its_first_process_line():
    texts = ["something", "Process 3 exit with status code 2.", "Process 0 exit with status code 1."]
    assert first_rank_failure(texts) == (3, 2)
    assert first_rank_failure(["Root Cause (first observed failure):", "[0]:"]) is None


def test_a_worker_killed_by_a_signal_is_torchruns_root_cause_with_its_signal():
    summary = TORCHRUN_SUMMARY.replace("exitcode  : 1 (pid: 8)", "exitcode  : -6 (pid: 8)  (SIGABRT)")
    assert first_rank_failure(summary.splitlines()) == (1, -6)
