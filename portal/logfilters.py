"""Filters of the portal's log handlers (settings.LOGGING)."""
import logging


class RefusalsInOneLine(logging.Filter):
    """A request refused with a 4xx (permission denied, a Host not allowed) is the client's doing,
    not a fault of the portal: Django logs it with the exception's traceback, which says nothing
    more. Its record keeps the message, with the exception's own words (escaped) after it, in one
    line."""

    def filter(self, record):
        status = getattr(record, "status_code", None)
        if record.exc_info and isinstance(status, int) and status < 500:
            said = str(record.exc_info[1] or "").encode("unicode_escape").decode("ascii")
            message = record.getMessage()
            record.msg, record.args = (f"{message}: {said}" if said and said not in message else message), ()
            record.exc_info = record.exc_text = None
        return True
