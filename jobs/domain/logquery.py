"""Reading a job's stored log: one page of lines (the API and the job page), or all of it as
text (the download). Lines are read by seq, the per-job gap-free order they were stored in."""
import bisect

from django.db.models import Q

from jobs.models import LogLine
from runners.output import METRIC_PREFIX

ALL_RANKS = ...
DOWNLOAD_CHUNK = 5000


def parse_rank(value):
    """A rank filter from a query string: a number, "launcher" (None), or ALL_RANKS if absent."""
    if value in (None, ""):
        return ALL_RANKS
    if value == "launcher":
        return None
    if value.isascii() and value.isdigit() and int(value) < 2 ** 31:
        return int(value)
    raise ValueError(value)


def filtered_lines(job, rank=ALL_RANKS, text="", hide_metrics=False):
    """A job's lines, optionally of one rank and/or containing `text` (case-insensitive), and
    without the `RINGMASTER_METRIC {...}` lines a script prints for the charts."""
    lines = LogLine.objects.filter(job=job)
    if rank is not ALL_RANKS:
        lines = lines.filter(rank=rank)
    if hide_metrics:
        lines = lines.exclude(text__contains=METRIC_PREFIX)
    if text:
        lines = lines.filter(text__icontains=text)
    return lines


def log_page(job, *, since=-1, before=None, limit=1000, rank=ALL_RANKS, text="", hide_metrics=False, seqs=None):
    """Lines with since < seq (< before), in seq order.

    Without `before`, the first `limit` lines after `since` (reading forwards, following a log).
    With `before`, the last `limit` lines before it (reading backwards: the tail of the log, or the
    page above the oldest line a viewer holds). `seqs`: only lines of this range (one attempt's:
    attempt_seqs).
    """
    lines = filtered_lines(job, rank, text, hide_metrics).filter(seq__gt=since)
    if seqs is not None:
        lines = lines.filter(seq__gte=seqs.start) if seqs.stop is None else lines.filter(seq__gte=seqs.start,
                                                                                          seq__lt=seqs.stop)
    if before is None:
        return list(lines.order_by("seq")[:limit])
    return list(lines.filter(seq__lt=before).order_by("-seq")[:limit])[::-1]


def attempt_seqs(job, number):
    """The seqs of attempt `number`'s lines (a slice: stop None while it is the last), or None
    where the job has no such attempt."""
    firsts = dict(job.attempts.values_list("number", "first_seq"))
    if number not in firsts:
        return None
    return slice(firsts[number], firsts.get(number + 1))


def with_context(job, hits, context, *, text="", rank=ALL_RANKS, hide_metrics=False):
    """The search hits (for `text`) and, around each, up to `context` lines of the same view
    (rank filter, metric lines hidden or not) before and after it, in seq order, as grep -C
    shows them, each line's `hit` set; a line that is context of two hits comes once, and a
    neighbour that matches too (a hit of the next page) counts as a hit."""
    view = filtered_lines(job, rank, hide_metrics=hide_metrics)
    found = {line.seq: line for line in hits}
    for line in hits:
        line.hit = True
    if rank is ALL_RANKS and not hide_metrics:
        # seq has no gaps: a hit's neighbours are the seqs around it, one query for the page.
        wanted = {seq for hit in hits for seq in range(hit.seq - context, hit.seq + context + 1)} - found.keys()
        neighbours = view.filter(seq__in=sorted(wanted)) if wanted else []
    else:
        neighbours = _nearest(view, [hit.seq for hit in hits], context, reach=context * (job.gpus + 2) * 2)
    needle = text.lower()
    for line in neighbours:
        if line.seq not in found:
            line.hit = bool(needle) and needle in line.text.lower()
            found[line.seq] = line
    return [found[seq] for seq in sorted(found)]


def _nearest(view, seqs, count, reach):
    """The `count` lines of `view` before and after each seq. One query reads the lines within
    `reach` of them, which holds them when the view's lines are not too sparse there (one rank of
    a few interleaved); a side it leaves short asks on its own."""
    window = Q()
    for seq in seqs:
        window |= Q(seq__gte=seq - reach, seq__lte=seq + reach)
    near = list(view.filter(window).order_by("seq"))
    near_seqs = [line.seq for line in near]
    found = []
    for seq in seqs:
        at = bisect.bisect_left(near_seqs, seq)
        before = [line for line in near[max(0, at - count):at] if line.seq >= seq - reach]
        after_at = at + (at < len(near_seqs) and near_seqs[at] == seq)
        after = [line for line in near[after_at:after_at + count] if line.seq <= seq + reach]
        if len(before) < count and seq - reach > 0:
            before = view.filter(seq__lt=seq).order_by("-seq")[:count]
        if len(after) < count:
            after = view.filter(seq__gt=seq).order_by("seq")[:count]
        found += list(before) + list(after)
    return found


def rank_tag(rank):
    return "launcher" if rank is None else str(rank)


def download_chunks(job, rank=ALL_RANKS):
    """The log as text, in chunks of many lines; every line carries its rank unless one rank was
    asked for. Reads in keyset pages, so a million-line log never sits in memory at once."""
    after = -1
    while True:
        page = list(filtered_lines(job, rank).filter(seq__gt=after).order_by("seq")
                    .values_list("seq", "rank", "text")[:DOWNLOAD_CHUNK])
        if not page:
            return
        if rank is ALL_RANKS:
            yield "".join(f"[{rank_tag(r)}] {text}\n" for _, r, text in page)
        else:
            yield "".join(f"{text}\n" for _, _, text in page)
        after = page[-1][0]
