"""The API's JSON parser: DRF's, refusing as a 400 what could only fail later as a 500."""
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from jobs.web.params import fits, range_problem, sentence, text_problem

MAX_DEPTH = 32


class JSONParser(parsers.JSONParser):
    """JSON nested past what the decoder can follow is a parse error; in an object, a field
    whose text (keys or values, at any depth) holds a NUL byte or a lone surrogate, that holds
    an integer past 64 bits (jobs.web.params.BIGINT), or that is nested more than MAX_DEPTH
    deep, is refused naming the field."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        if isinstance(data, dict):
            errors = {name: [problem] for name, value in data.items()
                      if (problem := _problem(name) or _problem(value))}
            if errors:
                raise ValidationError(errors)
        return data


def _problem(value):
    """What is wrong with the text or integers in `value` (walked without recursion), or None."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"Nested more than {MAX_DEPTH} levels deep."
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return sentence(problem)
        elif isinstance(item, int) and not fits(item):
            return range_problem()
        elif isinstance(item, dict):
            stack.extend((part, depth + 1) for pair in item.items() for part in pair)
        elif isinstance(item, list):
            stack.extend((part, depth + 1) for part in item)
    return None
