"""Reading what a client sends in a query string or a text field, one rule for every view: a
value that cannot be what the field holds is a 400 naming the field, never a 500 from deeper
down (a NUL byte PostgreSQL refuses, a lone surrogate UTF-8 cannot encode, a number past the
column's range, a digit int() does not read).

An integer from a client fits in 64 bits (BIGINT: the widest integer column, and the widest
integer SQLite holds) or is refused: in a query string by integer(), in a JSON body by
jobs.web.parsers, in a URL by IdConverter (a 404: no row has that id)."""

from django.urls import register_converter
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

BIGINT = (-(2 ** 63), 2 ** 63 - 1)        # a seq
INTEGER = (-(2 ** 31), 2 ** 31 - 1)       # a rank
MAX_TEXT = 10_000


def fits(number, bounds=BIGINT):
    """Whether `number` lies within `bounds` (inclusive)."""
    low, high = bounds
    return low <= number <= high


def range_problem(bounds=BIGINT):
    """What an integer outside `bounds` is told."""
    return "Must be an integer from {} to {}.".format(*bounds)


def text_problem(value):
    """Why `value` cannot be stored or searched as text ("must not ..."), or None."""
    if "\x00" in value:
        return "must not contain NUL bytes"
    if any("\ud800" <= char <= "\udfff" for char in value):
        return "must be valid Unicode text (it holds a lone surrogate)"
    return None


def sentence(clause):
    return clause[0].upper() + clause[1:] + "."


def text(params, name, errors, default=""):
    """A text query parameter, or `default` when absent."""
    value = params.get(name, default)
    problem = text_problem(value) or (f"at most {MAX_TEXT:,} characters" if len(value) > MAX_TEXT else None)
    if problem:
        errors[name] = [sentence(problem)]
        return default
    return value


def integer(params, name, errors, default=None, bounds=BIGINT):
    """An integer query parameter within `bounds` (inclusive), or `default` when absent."""
    value = params.get(name, "")
    if value == "":
        return default
    if not plain_digits(value.removeprefix("-")) or not fits(int(value), bounds):
        errors[name] = [range_problem(bounds)]
        return default
    return int(value)


def boolean(params, name, errors, default=False):
    """A yes/no query parameter: 1/true/yes or 0/false/no (any case), or `default` when absent."""
    value = params.get(name, "").lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "0", "false", "no"):
        return value in ("1", "true", "yes")
    errors[name] = ["Must be true or false (1 or 0)."]
    return default


def plain_digits(value):
    """True for a string of ASCII digits: what int() reads as an id (str.isdigit() also takes ²)."""
    return isinstance(value, str) and value.isascii() and value.isdigit()


class Pagination(LimitOffsetPagination):
    """DRF's ?limit=&offset= paging, its numbers read by integer(): one that is not a count of
    rows (not a number, below its bound, past 64 bits) is a 400 naming it. DRF's own reader
    takes the default for the first two and hands the third to the database's LIMIT, which
    SQLite and PostgreSQL answer with an error (a 500)."""

    limit_bounds = (1, BIGINT[1])
    offset_bounds = (0, BIGINT[1])

    def get_limit(self, request):
        return self._integer(request, self.limit_query_param, self.default_limit, self.limit_bounds)

    def get_offset(self, request):
        return self._integer(request, self.offset_query_param, 0, self.offset_bounds)

    @staticmethod
    def _integer(request, name, default, bounds):
        errors = {}
        value = integer(request.query_params, name, errors, default, bounds)
        if errors:
            raise ValidationError(errors)
        return value


class IdConverter:
    """A row id in a URL: digits that fit the id column (a longer number is a 404, not a 500)."""

    regex = "[0-9]{1,19}"

    def to_python(self, value):
        if not fits(int(value)):
            raise ValueError(value)
        return int(value)

    def to_url(self, value):
        return str(value)


register_converter(IdConverter, "id")       # <id:...> in jobs.web.urls, api_urls and websocket routes
