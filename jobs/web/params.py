"""Reading what a client sends in a query string or a text field, one rule for every view: a
value that cannot be what the field holds is a 400 naming the field, never a 500 from deeper
down (a NUL byte PostgreSQL refuses, a lone surrogate UTF-8 cannot encode, a number past the
column's range, a digit int() does not read)."""

from django.urls import register_converter

BIGINT = (-(2 ** 63), 2 ** 63 - 1)        # a seq
INTEGER = (-(2 ** 31), 2 ** 31 - 1)       # a rank
MAX_TEXT = 10_000


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
    low, high = bounds
    if not (value.lstrip("-").isascii() and value.lstrip("-").isdigit()) or not low <= int(value) <= high:
        errors[name] = [f"Must be an integer from {low} to {high}."]
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


class IdConverter:
    """A row id in a URL: digits that fit the id column (a longer number is a 404, not a 500)."""

    regex = "[0-9]{1,19}"

    def to_python(self, value):
        if int(value) > BIGINT[1]:
            raise ValueError(value)
        return int(value)

    def to_url(self, value):
        return str(value)


register_converter(IdConverter, "id")       # <id:...> in jobs.web.urls, api_urls and websocket routes
