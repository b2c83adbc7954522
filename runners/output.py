"""Split the combined output of ``horovodrun``/``mpirun`` into per-rank lines and metrics.

Standard library only: this module is shared by the Celery runners and the follower that
tails job logs, and must stay importable without Django.

Input formats (see ``shared/reference/horovod.md`` sections 2a, 2b and 5)
-------------------------------------------------------------------------

Gloo (``horovodrun --gloo`` and every elastic run)
    Each record of a worker is ``[<rank>]<stdout>:text`` or ``[<rank>]<stderr>:text`` with no
    space after the colon. Horovod flushes a record at every ``\\n`` *and* every ``\\r``, so a
    progress bar arrives as ``[2]<stdout>:progress 10%\\r[2]<stdout>:progress 20%\\r...`` and a
    ``\\r\\n`` ending arrives as ``[2]<stdout>:crlf line\\r[2]<stdout>:\\n``. A rank's final
    unterminated text can be followed by another rank's tag on the same physical line. With
    ``--prefix-output-with-timestamp`` an ``asctime()`` stamp is glued in front of the tag:
    ``Sun Nov 22 01:41:09 2026[0]<stdout>:hi`` (the day is space padded: ``Mon Jun  2``).

Open MPI ``--tag-output`` (``horovodrun --mpi``, plain ``mpirun``)
    ``[<jobid>,<rank>]<stdout|stderr|stddiag>:text``; with ``--timestamp-output`` a ``ctime()``
    stamp (same layout as ``asctime()``) is glued in front. Open MPI tags every forwarded
    *chunk*, not every line, so a tag may appear in the middle of a line:
    ``[1,0]<stdout>:hel[1,0]<stdout>:lo\\n`` is the single line ``hello`` of rank 0, and another
    rank's chunk may sit between the two halves. ``\\r`` is not a tagging point in Open MPI.

Untagged text
    horovodrun's and mpirun's own messages (``Process 1 exit with status code 3.``, tracebacks,
    help blocks) carry no tag. They become lines of the launcher: ``rank=None``, ``stdout``.

How :class:`OutputSplitter` works
---------------------------------

The byte stream is cut at ``\\n`` and ``\\r`` first (safe for UTF-8, whose multi-byte sequences
never contain those bytes). Every tag in a segment switches the *target* ``(rank, stream)``;
the bytes after it are appended to that target's pending buffer. Text before a new tag that
was not terminated stays pending and is continued by that target's next segment.

* ``\\n`` emits the target's pending text. If that text is empty but a carriage text is pending
  (the Gloo ``\\r\\n`` case) the carriage text is emitted instead.
* ``\\r`` keeps only the latest state of a progress line: the terminated text becomes the
  target's *carriage* text, replacing the previous one. An empty ``\\r`` segment (a bare cursor
  return) leaves the carriage text alone.
* After ``\\n`` the target returns to the launcher (both Gloo and Open MPI re-tag after a newline).
  After ``\\r`` a Gloo target returns to the launcher (Gloo re-tags), an Open MPI target stays
  (Open MPI does not re-tag at ``\\r``).
* :meth:`OutputSplitter.finish` flushes every pending line at EOF.

Lines longer than ``max_line_bytes`` are cut on a UTF-8 boundary, followed by
:func:`truncation_marker`, and the rest of the line is dropped, so each ``(rank, stream)``
buffers at most about ``max_line_bytes``. Text is decoded with ``errors="replace"``.

:meth:`OutputSplitter.state` returns a JSON-serialisable snapshot; a splitter built from it
continues exactly where the original left off.

Metrics
-------

:func:`extract_metrics` understands ``RINGMASTER_METRIC {json object}`` lines and the lines
printed by Horovod's ``pytorch_synthetic_benchmark.py`` and ``pytorch_mnist.py`` examples.
:func:`parse_rank_failure` reads horovodrun's ``Process N exit with status code X.``, and
:func:`first_rank_failure` also the root cause that torchrun's summary of a failure names.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import operator
import re
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

__all__ = [
    "LAUNCHER",
    "MAX_LINE_BYTES",
    "METRIC_PREFIX",
    "Line",
    "Metric",
    "OutputSplitter",
    "extract_metrics",
    "lines_with_metrics",
    "parse_rank_failure",
    "first_rank_failure",
    "tag",
    "truncation_marker",
]

LAUNCHER = None  # rank value for untagged lines (horovodrun's / mpirun's own output)
MAX_LINE_BYTES = 64 * 1024
METRIC_PREFIX = "RINGMASTER_METRIC "
MAX_METRIC_NAME_LENGTH = 100

_STATE_VERSION = 1


class Line(NamedTuple):
    """One line of output (immutable; a tuple, as the splitter makes one for every line and a
    frozen dataclass costs more to build than the rest of the fast path)."""

    rank: int | None  # None = launcher (untagged)
    stream: str  # "stdout" | "stderr"  (Open MPI "stddiag" -> "stderr")
    text: str  # no trailing \n / \r
    ts: datetime | None  # from a timestamp glued before the tag (naive local time), else None


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    step: int | None  # None = no step in the line; the caller assigns arrival order


# --------------------------------------------------------------------------------------------
# Tags
# --------------------------------------------------------------------------------------------

_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MAX_ID_DIGITS = 9

# asctime()/ctime(): "%a %b %e %H:%M:%S %Y", e.g. "Mon Jun  2 01:41:09 2026".
# Also accepted: a single space before a two-digit day, or an unpadded one-digit day.
_TIMESTAMP_PATTERN = (
    rb"(?P<ts>(?:" + b"|".join(w.encode() for w in _WEEKDAYS) + rb") "
    rb"(?:" + b"|".join(m.encode() for m in _MONTHS) + rb")"
    rb" {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4})"
)
_ID_PATTERN = rb"\d{1,%d}" % _MAX_ID_DIGITS
# Gloo "[rank]<stream>:" and Open MPI "[jobid,rank]<stream>:", optionally time-stamped.
_TAG_RE = re.compile(
    rb"(?:" + _TIMESTAMP_PATTERN + rb")?"
    rb"\[(?:(?P<job>" + _ID_PATTERN + rb"),)?(?P<rank>" + _ID_PATTERN + rb")\]"
    rb"<(?P<stream>stdout|stderr|stddiag)>:"
)
# Longest possible tag: 25-byte timestamp + "[" job "," rank "]<stddiag>:".
_MAX_TAG_BYTES = 25 + 1 + _MAX_ID_DIGITS + 1 + _MAX_ID_DIGITS + len(b"]<stddiag>:")
_TERMINATOR_RE = re.compile(rb"[\r\n]")
# One whole Gloo record at the start of a segment: the common case, taken in one match (the fast
# path of OutputSplitter.feed); anything else (a timestamp, an Open MPI tag, a \r, a second tag
# in the text, a line over the limit, a rank with text pending) goes the general way.
_GLOO_RECORD_RE = re.compile(rb"\[(" + _ID_PATTERN + rb")\]<(stdout|stderr|stddiag)>:([^\r\n]*)\n")

_LAUNCHER_STREAM = "stdout"
_STREAM_NAMES = {b"stdout": "stdout", b"stderr": "stderr", b"stddiag": "stderr"}
# A Gloo tag as text, up to its ">:" (the digits spelled out: \d would take other scripts' digits).
_GLOO_HEAD_RE = re.compile(r"\[([0-9]{1,%d})\]<(stdout|stderr|stddiag)" % _MAX_ID_DIGITS)
_HEADS: dict[str, tuple] = {}              # a Gloo tag's text up to ">:" -> (rank, stream)
_MAX_HEADS = 4096
_MAX_HEAD_CHARS = 1 + _MAX_ID_DIGITS + len("]<stddiag")


def _gloo_keys(heads: tuple[str, ...]) -> list[tuple | None]:
    """(rank, stream) of each Gloo tag's text up to its ">:", or None where it is not one. A tag
    is parsed once and remembered (a job's records carry a few hundred), and looked up with no
    Python step per record; what is not a tag is not remembered."""
    missing = set(heads).difference(_HEADS)
    if missing:
        if len(_HEADS) + len(missing) > _MAX_HEADS:
            _HEADS.clear()
        for head in missing:
            if len(head) <= _MAX_HEAD_CHARS and (match := _GLOO_HEAD_RE.fullmatch(head)) is not None:
                _HEADS[head] = (int(match[1]), _STREAM_NAMES[match[2].encode()])
    return list(map(_HEADS.get, heads))


_Key = tuple  # (rank: int | None, stream: str)
_LAUNCHER_KEY: _Key = (LAUNCHER, _LAUNCHER_STREAM)


def tag(rank: int, stream: str, text: str) -> bytes:
    """Build one Gloo-style record ``[rank]<stream>:text\\n`` (for test fixtures)."""
    return f"[{rank}]<{stream}>:{text}\n".encode()


def truncation_marker(max_line_bytes: int) -> str:
    """Visible marker appended to a line cut at ``max_line_bytes``."""
    if max_line_bytes % 1024 == 0:
        size = f"{max_line_bytes // 1024} KiB"
    else:
        size = f"{max_line_bytes} bytes"
    return f"… [line truncated at {size}]"


def _parse_timestamp(raw: bytes | None) -> datetime | None:
    """Parse an asctime()-style stamp; None when absent or not a real date."""
    if not raw:
        return None
    _weekday, month, day, clock, year = raw.decode("ascii").split()
    hour, minute, second = (int(part) for part in clock.split(":"))
    try:
        return datetime(int(year), _MONTHS.index(month) + 1, int(day), hour, minute, second)
    except ValueError:
        return None


def _decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _utf8_cut(data: bytes | bytearray, limit: int, next_byte: int) -> int:
    """Largest cut position <= limit that does not split a UTF-8 character.

    ``next_byte`` is the byte that would follow ``data[:limit]``. Backs up at most three bytes
    (the longest continuation run of valid UTF-8); invalid input is cut at ``limit``.
    """
    cut = limit
    following = next_byte
    while cut > 0 and limit - cut < 3 and (following & 0xC0) == 0x80:
        cut -= 1
        following = data[cut]
    if (following & 0xC0) == 0x80:
        return limit
    return cut


def _ts_to_json(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def _ts_from_json(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


# --------------------------------------------------------------------------------------------
# Splitter
# --------------------------------------------------------------------------------------------


class _Pending:
    """Pending state of one (rank, stream): the open segment and the last carriage text."""

    __slots__ = ("is_open", "buf", "truncated", "ts", "carriage", "carriage_ts")

    def __init__(self) -> None:
        self.is_open = False  # a segment has started and is not terminated yet
        self.buf = bytearray()  # bytes of the open segment, at most max_line_bytes
        self.truncated = False  # the open segment overflowed; further bytes are dropped
        self.ts: datetime | None = None  # timestamp of the tag that opened the segment
        self.carriage: str | None = None  # last \r-terminated text
        self.carriage_ts: datetime | None = None

    def close_segment(self) -> None:
        self.is_open = False
        self.buf = bytearray()
        self.truncated = False
        self.ts = None

    @property
    def is_idle(self) -> bool:
        return not self.is_open and self.carriage is None

    def to_json(self, key: _Key) -> dict:
        return {
            "rank": key[0],
            "stream": key[1],
            "open": self.is_open,
            "buf": base64.b64encode(bytes(self.buf)).decode("ascii"),
            "truncated": self.truncated,
            "ts": _ts_to_json(self.ts),
            "carriage": self.carriage,
            "carriage_ts": _ts_to_json(self.carriage_ts),
        }

    @classmethod
    def from_json(cls, data: dict) -> tuple[_Key, _Pending]:
        pending = cls()
        pending.is_open = bool(data["open"])
        pending.buf = bytearray(base64.b64decode(data["buf"]))
        pending.truncated = bool(data["truncated"])
        pending.ts = _ts_from_json(data["ts"])
        pending.carriage = data["carriage"]
        pending.carriage_ts = _ts_from_json(data["carriage_ts"])
        return (data["rank"], data["stream"]), pending


class OutputSplitter:
    """Incrementally split horovodrun/mpirun output bytes into :class:`Line` objects.

    Feed bytes in any chunking; lines are returned in the order their terminators are seen.
    ``OutputSplitter(state=other.state())`` resumes exactly where ``other`` stopped (the line
    limit stored in the state wins over ``max_line_bytes``).
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, state: dict | None = None):
        if state is not None:
            max_line_bytes = state.get("max_line_bytes", max_line_bytes)
        if not isinstance(max_line_bytes, int) or max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be a positive int, got {max_line_bytes!r}")
        self._max_line_bytes = max_line_bytes
        self._marker = truncation_marker(max_line_bytes)
        self._reset()
        if state is not None:
            self._restore(state)

    # -- public API ---------------------------------------------------------------------------

    _fast_path = True  # whole Gloo records in one match (off: the general way only, for tests)
    # A run of records taken at once (_run_of_records) starts with this many bytes, and twice as
    # many each time it took all: a run that stops early has read at most that much for nothing.
    # Below the least, the loop of _whole_records takes the records (a run costs more than a few).
    _run_first_bytes, _run_most_bytes, _run_least_bytes = 64 << 10, 4 << 20, 2 << 10

    def feed(self, data: bytes) -> list[Line]:
        """Consume the next bytes; return the lines completed by them."""
        out: list[Line] = []
        raw = self._raw + bytes(data)
        start = 0
        self._runs = True
        at_segment_start = self._at_segment_start
        search = _TERMINATOR_RE.search
        while True:
            if at_segment_start and self._fast_path:
                start = self._whole_records(raw, start, out)
            match = search(raw, start)
            if match is None:
                break
            self._route(raw[start : match.start()])
            self._terminate(raw[match.start()], out)
            start = match.end()
            at_segment_start = True
        self._at_segment_start = start == len(raw)
        self._raw = self._route_unterminated(raw[start:])
        return out

    def _whole_records(self, raw: bytes, start: int, out: list[Line]) -> int:
        """The fast path: take the whole Gloo records that follow one another from `start` on
        (a segment's start) as lines, many at once (_run_of_records), then in one loop; returns
        where the first record it could not take begins (the general way takes that one)."""
        taken = start
        record, streams, pending, limit = _GLOO_RECORD_RE.match, _STREAM_NAMES, self._pending, self._max_line_bytes
        new_line, append = tuple.__new__, out.append      # Line's own __new__ is a Python call per line
        runs = self._runs and not pending
        while (whole := record(raw, start)) is not None:
            if runs:                                        # first, many records at once
                runs = False
                if (after := self._run_of_records(raw, start, out)) != start:
                    start = after
                    continue
            rank, stream, text = whole.groups()
            rank, stream = int(rank), streams[stream]
            if (pending and (rank, stream) in pending) or len(text) > limit or b"]<" in text:
                break
            append(new_line(Line, (rank, stream, text.decode("utf-8", "replace"), None)))
            start = whole.end()
        if start != taken and self._target is not _LAUNCHER_KEY:
            self._to_launcher()
        return start

    def _run_of_records(self, raw: bytes, start: int, out: list[Line]) -> int:
        """The whole Gloo records from `start` (where one starts) up to the first \\r, in runs of
        _run_first_bytes and more (_records_at_once); returns where the last one taken ends. Once
        a run stops early, the rest of this feed goes record by record (a new run at each record
        would read the rest of the chunk again and again)."""
        stop = raw.find(b"\r", start)
        if stop < 0:
            stop = len(raw)
        size = self._run_first_bytes
        while (end := raw.rfind(b"\n", start, min(stop, start + size))) - start >= self._run_least_bytes:
            taken = self._records_at_once(raw, start, end, out)
            if taken <= end:
                self._runs = False
                return taken
            start, size = taken, min(size * 2, self._run_most_bytes)
        return start

    def _records_at_once(self, raw: bytes, start: int, end: int, out: list[Line]) -> int:
        """The records of raw[start:end + 1] (each a line ending "\\n", none with "\\r") as
        lines, up to the first one the loop of _whole_records would not take, with no Python
        step per line: decoded in one piece (a record's text ends at its "\\n", so no byte of it
        can join the next one's in the decoder), split at "\\n" and at each tag's ">:". Returns
        where the last one taken ends."""
        text = raw[start:end].decode("utf-8", "replace")
        records = text.split("\n")
        heads, separators, texts = zip(*map(str.partition, records, itertools.repeat(">:")))
        keys = _gloo_keys(heads)
        count = len(records)
        if None in keys:
            count = keys.index(None)
        if "" in separators[:count]:
            count = separators.index("")
        # A text that holds "]<" (a tag, maybe) goes the general way. Each tag holds one "]<".
        if count < len(records) or text.count("]<") != count:
            holds = list(map(operator.contains, texts[:count], itertools.repeat("]<")))
            if True in holds:
                count = holds.index(True)
        # Over the line limit: the loop measures those in bytes (a character is 1 to 4 of them).
        too_long = self._max_line_bytes if text.isascii() else self._max_line_bytes // 4
        if count and max(map(len, texts[:count])) > too_long:
            count = next(index for index, each in enumerate(texts) if len(each) > too_long)
        if count:
            ranks, streams = zip(*keys[:count])
            out.extend(map(tuple.__new__, itertools.repeat(Line),
                           zip(ranks, streams, texts[:count], itertools.repeat(None))))
        if count == len(records):
            return end + 1
        for _ in range(count):
            start = raw.index(b"\n", start) + 1
        return start

    def finish(self) -> list[Line]:
        """At EOF: flush every pending partial line (in the order the lines started)."""
        self._route(self._raw)
        out: list[Line] = []
        for key, pending in self._pending.items():
            if pending.is_open and pending.buf:
                out.append(self._line(key, self._segment_text(pending), pending.ts))
            elif pending.carriage is not None:
                out.append(self._line(key, pending.carriage, pending.carriage_ts))
        self._reset()
        return out

    def state(self) -> dict:
        """JSON-serialisable snapshot of everything pending."""
        target_rank, target_stream = self._target
        return {
            "version": _STATE_VERSION,
            "max_line_bytes": self._max_line_bytes,
            "raw": base64.b64encode(self._raw).decode("ascii"),
            "target": {
                "rank": target_rank,
                "stream": target_stream,
                "ts": _ts_to_json(self._target_ts),
                "keep_on_cr": self._target_keep_on_cr,
            },
            "pending": [pending.to_json(key) for key, pending in self._pending.items()],
        }

    # -- state ----------------------------------------------------------------------------

    def _reset(self) -> None:
        self._raw = b""  # unterminated bytes not routed yet (a possible partial tag)
        self._at_segment_start = True  # the next byte fed starts a segment (none of it routed)
        self._pending: dict[_Key, _Pending] = {}  # insertion order = order lines started
        self._to_launcher()

    def _to_launcher(self) -> None:
        self._target: _Key = _LAUNCHER_KEY
        self._target_ts: datetime | None = None
        self._target_keep_on_cr = True  # stays the launcher anyway

    def _restore(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported OutputSplitter state version: {state.get('version')!r}")
        self._raw = base64.b64decode(state["raw"])
        self._at_segment_start = False  # not known: the general way finds out
        target = state["target"]
        self._target = (target["rank"], target["stream"])
        self._target_ts = _ts_from_json(target["ts"])
        self._target_keep_on_cr = bool(target["keep_on_cr"])
        self._pending = dict(_Pending.from_json(item) for item in state["pending"])

    # -- routing ------------------------------------------------------------------------------

    def _route(self, segment: bytes) -> None:
        """Route a segment with no terminator in it whose end is known to be final."""
        position = self._route_tags(segment)
        self._append(segment[position:])

    def _route_unterminated(self, segment: bytes) -> bytes:
        """Route what is certain of an unterminated tail; return the bytes to hold back.

        Any tag not complete yet starts within the last ``_MAX_TAG_BYTES`` bytes, so holding
        those back (and rescanning them with the next feed) finds the same tags as one-shot
        feeding would.
        """
        position = self._route_tags(segment)
        hold_from = max(position, len(segment) - _MAX_TAG_BYTES)
        self._append(segment[position:hold_from])
        return segment[hold_from:]

    def _route_tags(self, segment: bytes) -> int:
        """Route the text between the tags of ``segment``; return the end of the last tag."""
        position = 0
        for match in _TAG_RE.finditer(segment):
            self._append(segment[position : match.start()])
            self._switch_target(match)
            position = match.end()
        return position

    def _switch_target(self, match: re.Match) -> None:
        self._target = (int(match["rank"]), _STREAM_NAMES[match["stream"]])
        self._target_ts = _parse_timestamp(match["ts"])
        # Open MPI ("[job,rank]") does not re-tag after \r; Gloo ("[rank]") does.
        self._target_keep_on_cr = match["job"] is not None

    def _open_target(self) -> _Pending:
        pending = self._pending.get(self._target)
        if pending is None:
            pending = self._pending[self._target] = _Pending()
        if not pending.is_open:
            pending.is_open = True
            pending.ts = self._target_ts
        return pending

    def _append(self, data: bytes) -> None:
        """Append text to the target's open segment, enforcing the line limit."""
        if not data:
            return
        pending = self._open_target()
        if pending.truncated:
            return
        room = self._max_line_bytes - len(pending.buf)
        if len(data) <= room:
            pending.buf += data
            return
        pending.buf += data[:room]
        cut = _utf8_cut(pending.buf, len(pending.buf), data[room])
        del pending.buf[cut:]
        pending.truncated = True

    # -- terminators ----------------------------------------------------------------------

    def _terminate(self, terminator: int, out: list[Line]) -> None:
        key = self._target
        pending = self._open_target()
        if terminator == ord("\r"):
            self._carriage_return(pending)
            if not self._target_keep_on_cr:
                self._to_launcher()
        else:
            out.append(self._newline_line(key, pending))
            pending.close_segment()
            pending.carriage = pending.carriage_ts = None
            self._to_launcher()
        if pending.is_idle:
            del self._pending[key]

    def _carriage_return(self, pending: _Pending) -> None:
        if pending.buf:
            pending.carriage = self._segment_text(pending)
            pending.carriage_ts = pending.ts
        pending.close_segment()

    def _newline_line(self, key: _Key, pending: _Pending) -> Line:
        if not pending.buf and pending.carriage is not None:
            return self._line(key, pending.carriage, pending.carriage_ts)
        return self._line(key, self._segment_text(pending), pending.ts)

    def _segment_text(self, pending: _Pending) -> str:
        text = _decode(pending.buf)
        return text + self._marker if pending.truncated else text

    @staticmethod
    def _line(key: _Key, text: str, ts: datetime | None) -> Line:
        return Line(rank=key[0], stream=key[1], text=text, ts=ts)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_BENCH_ITER_RE = re.compile(rf"Iter #(\d+): ({_NUMBER}) img/sec per (?:GPU|CPU)")
_BENCH_MEAN_RE = re.compile(rf"Img/sec per (?:GPU|CPU): ({_NUMBER}) \+-({_NUMBER})")
_BENCH_TOTAL_RE = re.compile(
    rf"Total img/sec on (\d+) (?:GPU|CPU)\(s\): ({_NUMBER}) \+-({_NUMBER})"
)
_MNIST_TRAIN_RE = re.compile(
    rf"Train Epoch: (\d+) \[(\d+)/(\d+) \((\d+)%\)\]\s+Loss: ({_NUMBER})(?:\s.*)?"
)
_MNIST_TEST_RE = re.compile(rf"Test set: Average loss: ({_NUMBER}), Accuracy: ({_NUMBER})%")
_RANK_FAILURE_RE = re.compile(r"Process (\d+) exit with status code (-?\d+)\.")
# Open MPI's mpirun, for a rank killed by a signal (exit code 128 + signal, as a shell reports it).
_MPIRUN_SIGNAL_RE = re.compile(r"mpirun noticed that process rank (\d+) with PID \d+ on node \S+ "
                               r"exited on signal (\d+)\b.*")


def _finite(value: str) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _metrics(step: int | None, *pairs: tuple[str, str]) -> list[Metric]:
    """Metrics for the (name, number text) pairs whose value is finite."""
    result = []
    for name, text in pairs:
        value = _finite(text)
        if value is not None:
            result.append(Metric(name, value, step))
    return result


def _json_metrics(payload: str) -> list[Metric]:
    """Metrics of a ``RINGMASTER_METRIC`` JSON object (text after the prefix)."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return []
    if not isinstance(data, dict):
        return []
    step = data.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        step = None
    result = []
    for name, value in data.items():
        if name == "step" or not name or len(name) > MAX_METRIC_NAME_LENGTH:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            number = float(value)
        except OverflowError:
            continue
        if math.isfinite(number):
            result.append(Metric(name, number, step))
    return result


def _benchmark_metrics(text: str) -> list[Metric] | None:
    """Horovod ``pytorch_synthetic_benchmark.py`` lines, or None when not one."""
    if match := _BENCH_ITER_RE.fullmatch(text):
        return _metrics(int(match[1]), ("img_per_sec", match[2]))
    if match := _BENCH_MEAN_RE.fullmatch(text):
        return _metrics(None, ("img_per_sec_mean", match[1]))
    if match := _BENCH_TOTAL_RE.fullmatch(text):
        return _metrics(None, ("total_img_per_sec", match[2]))
    return None


def _mnist_metrics(text: str) -> list[Metric] | None:
    """Horovod ``pytorch_mnist.py`` lines, or None when not one.

    The training step is ``(epoch - 1) * samples_per_epoch + samples_seen`` (per rank).
    """
    if match := _MNIST_TRAIN_RE.fullmatch(text):
        epoch, seen, total = int(match[1]), int(match[2]), int(match[3])
        step = (epoch - 1) * total + seen
        return _metrics(step if step >= 0 else None, ("loss", match[5]))
    if match := _MNIST_TEST_RE.fullmatch(text):
        return _metrics(None, ("test_loss", match[1]), ("test_accuracy", match[2]))
    return None


# What a line must hold for extract_metrics to find a metric in it, besides METRIC_PREFIX: a word
# of each example's line (_BENCH_*_RE, _MNIST_*_RE).
_BENCHMARK_MARKER, _MNIST_TRAIN_MARKER, _MNIST_TEST_MARKER = _EXAMPLE_MARKERS = ("mg/sec", "Train Epoch", "Test set")


def extract_metrics(text: str) -> list[Metric]:
    """Metrics found in one output line (the text of a :class:`Line`); never raises.

    * ``RINGMASTER_METRIC {"step": 10, "loss": 0.31}`` (the prefix may follow other text, e.g.
      a logging prefix): every finite int/float value except ``step`` is a metric; ``step`` is
      used when it is a non-negative int, else the step is None. Names longer than
      ``MAX_METRIC_NAME_LENGTH`` are skipped.
    * Horovod synthetic benchmark and MNIST example lines (see the reference, section 5).
    """
    if not isinstance(text, str):
        return []
    try:
        index = text.find(METRIC_PREFIX)
        if index >= 0:
            return _json_metrics(text[index + len(METRIC_PREFIX) :])
        if _BENCHMARK_MARKER not in text and _MNIST_TRAIN_MARKER not in text and _MNIST_TEST_MARKER not in text:
            return []                               # no line the parsers below read: most lines
        stripped = text.strip()
        for parser in (_benchmark_metrics, _mnist_metrics):
            found = parser(stripped)
            if found is not None:
                return found
    except (ValueError, OverflowError):
        pass
    return []


def lines_with_metrics(texts: list[str]) -> list[int]:
    """The indices, in order, of the texts in which :func:`extract_metrics` can find a metric (in
    the others it finds none): four substring tests in one comprehension, with no call per text
    (most lines hold no metric, and a 64-rank job's follower would otherwise call extract_metrics
    on each)."""
    prefix, benchmark, mnist_train, mnist_test = METRIC_PREFIX, *_EXAMPLE_MARKERS
    return [index for index, text in enumerate(texts)
            if prefix in text or benchmark in text or mnist_train in text or mnist_test in text]


def parse_rank_failure(text: str) -> tuple[int, int] | None:
    """``(rank, exit code)`` from horovodrun's ``Process N exit with status code X.`` or mpirun's
    ``mpirun noticed that process rank N ... exited on signal S`` (code 128 + S), else None."""
    match = _RANK_FAILURE_RE.fullmatch(text.strip())
    if match is not None:
        return int(match[1]), int(match[2])
    match = _MPIRUN_SIGNAL_RE.fullmatch(text.strip())
    if match is not None:
        return int(match[1]), 128 + int(match[2])
    return None


# torchrun's summary of a failed job names the first failure that its workers' error files
# recorded: "Root Cause (first observed failure):", then the failure's fields, one per line.
_ROOT_CAUSE = "Root Cause (first observed failure):"
_TORCHRUN_RANK_RE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)")
_TORCHRUN_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+) \(pid: \d+\)(?:\s+\(SIG\w+\))?")


def first_rank_failure(texts: list[str]) -> tuple[int, int] | None:
    """``(rank, exit code)`` of the first failure that the launcher's own lines `texts` name:
    horovodrun's or mpirun's line (parse_rank_failure), or the root cause of torchrun's summary."""
    in_root_cause, rank = False, None
    for text in texts:
        found = parse_rank_failure(text)
        if found is not None:
            return found
        text = text.strip()
        if text == _ROOT_CAUSE:
            in_root_cause, rank = True, None
        elif in_root_cause and (match := _TORCHRUN_RANK_RE.fullmatch(text)):
            rank = int(match[1])
        elif in_root_cause and rank is not None and (match := _TORCHRUN_EXIT_RE.fullmatch(text)):
            return rank, int(match[1])
    return None


# --- what a failing rank said ---------------------------------------------------------------
TRACEBACK = "Traceback (most recent call last):"
# Exceptions a rank raises because another one failed first (Horovod shut down under it).
_SECONDARY_RE = re.compile(r"HorovodInternalError|Horovod has been shut down|HorovodShutdown")
_EXCEPTION_RE = re.compile(r"[A-Za-z_][\w.]*(?::\s.*)?")


def exception_line(after_traceback: list[str]) -> str | None:
    """The exception a Python traceback ends with (``RuntimeError: boom``), given the lines of
    one rank's stderr that follow its ``Traceback (most recent call last):``; None if it has not
    ended yet. Frames are indented; the first unindented line that looks like ``Name: message``
    (or a bare name) ends a traceback. A chained one ("During handling of the above exception,
    another exception occurred:") goes on to the last exception."""
    found, in_traceback = None, True
    for text in after_traceback:
        if not text.strip() or text[0] in " \t":
            continue
        if text == TRACEBACK or text.startswith(("During handling of the above exception",
                                                 "The above exception was the direct cause")):
            in_traceback = True
        elif in_traceback and _EXCEPTION_RE.fullmatch(text):
            found, in_traceback = text, False
        elif not in_traceback:
            break                                  # what the rank printed after its traceback
    return found


# What the rank launcher (job_python/ringmaster_rank.py) raises where the world a script's ranks
# make is not the job's (a Horovod script under torchrun): its message is the whole reason.
WORLD_SIZE_MISMATCH = "WorldSizeMismatch"


def world_size_mismatch(text: str) -> str | None:
    """The message of a rank's ``WorldSizeMismatch: this job has 2 ranks but ...``, else None."""
    name, _, message = text.partition(":")
    return message.strip() if name.rsplit(".", 1)[-1] == WORLD_SIZE_MISMATCH and message.strip() else None


def exception_name(text: str) -> str:
    """``HorovodInternalError`` of ``horovod.common.exceptions.HorovodInternalError: ...``."""
    return text.split(":", 1)[0].rsplit(".", 1)[-1]


def is_secondary(text: str) -> bool:
    """Whether a rank's exception only says that Horovod stopped under it because of another rank."""
    return bool(_SECONDARY_RE.search(text))


def signal_exit(code: int | None) -> str | None:
    """``killed by signal 9 (SIGKILL)`` for an exit status that is a signal (-9, or 128 + 9 as
    shells and mpirun report it), else None."""
    import signal as signals

    if code is None or not (code < 0 or 128 < code < 128 + 65):
        return None
    number = -code if code < 0 else code - 128
    try:
        name = signals.Signals(number).name
    except ValueError:
        return f"killed by signal {number}"
    hint = "; the kernel's out-of-memory killer sends it when memory runs out" if number == 9 else ""
    return f"killed by signal {number} ({name}{hint})"
