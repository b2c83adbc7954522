"""Reading a job's stored log: one page of lines (the API and the job page), or all of it as
text (the download). Lines are read by seq, the per-job gap-free order they were stored in."""
from jobs.models import LogLine

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


def filtered_lines(job, rank=ALL_RANKS, text=""):
    """A job's lines, optionally of one rank and/or containing `text` (case-insensitive)."""
    lines = LogLine.objects.filter(job=job)
    if rank is not ALL_RANKS:
        lines = lines.filter(rank=rank)
    if text:
        lines = lines.filter(text__icontains=text)
    return lines


def log_page(job, *, since=-1, before=None, limit=1000, rank=ALL_RANKS, text=""):
    """Lines with since < seq (< before), in seq order.

    Without `before`, the first `limit` lines after `since` (reading forwards, following a log).
    With `before`, the last `limit` lines before it (reading backwards: the tail of the log, or the
    page above the oldest line a viewer holds).
    """
    lines = filtered_lines(job, rank, text).filter(seq__gt=since)
    if before is None:
        return list(lines.order_by("seq")[:limit])
    return list(lines.filter(seq__lt=before).order_by("-seq")[:limit])[::-1]


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
