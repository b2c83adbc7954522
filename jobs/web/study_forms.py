"""A study as submitted (POST /api/studies/): every refusal names its field (DESIGN.md's contract).

The base job is checked by JobForm itself, with a sample of the search space in its placeholders
and the study's tag among its tags: what a trial's job would be refused for is refused here,
listed under "base" as "<field>: <message>".
"""
import math

from jobs.domain import quotas, studies
from jobs.web.forms import JobForm
from jobs.web.params import text_problem

MAX_CHOICES = 1000
MAX_NAME = 100
MAX_NUMBER = 2 ** 53
SCALARS = (str, int, float, bool)


class StudyForm:
    """`data`: the request's JSON object. is_valid(); then `spec` (what the study keeps) or `errors`
    ({field: [messages]})."""

    def __init__(self, data, *, user):
        self.data, self.user = data, user
        self.errors, self.spec = {}, None

    def is_valid(self):
        if not isinstance(self.data, dict):
            self.errors = {"non_field_errors": ["Send a JSON object."]}
            return False
        spec = {
            "name": self._name(),
            "base": self._base(),
            "space": self._space(),
            "objective": self._objective(),
            "trials": self._integer("trials", required=True, most=studies.MAX_TRIALS),
            "parallel": self._integer("parallel", default=1, most=studies.MAX_TRIALS),
            "sampler": self._choice("sampler", studies.SAMPLERS, "tpe"),
            "pruner": self._choice("pruner", studies.PRUNERS, "none"),
        }
        unknown = sorted(str(name) for name in self.data if name not in spec)
        for name in unknown:
            self._refuse(name, f"Unknown field; a study takes {', '.join(spec)}.")
        if not self.errors:
            self._placeholders(spec)
        if not self.errors:
            self._grid(spec)
        if not self.errors:
            self._job(spec)
        if self.errors:
            return False
        self.spec = spec
        return True

    def _refuse(self, field, message):
        self.errors.setdefault(field, []).append(message)

    def _name(self):
        name = self.data.get("name")
        if not isinstance(name, str) or not name.strip():
            self._refuse("name", "Give the study a name.")
            return None
        name = name.strip()
        if len(name) > MAX_NAME or text_problem(name):
            self._refuse("name", f"At most {MAX_NAME} characters of text.")
        return name

    def _base(self):
        base = self.data.get("base")
        if not isinstance(base, dict):
            self._refuse("base", "Give the base job: an object of a job's fields (as POST /api/jobs/ takes), "
                                 "with {name} placeholders in args and env.")
            return None
        return base

    def _space(self):
        space = self.data.get("space")
        if not isinstance(space, dict) or not space:
            self._refuse("space", 'Give the search space: {"<name>": {"type": "float" | "int" | "categorical", '
                                  '"low", "high", "log"?, "choices"?}}.')
            return None
        cleaned = {}
        for name, entry in space.items():
            problem = None
            if not studies.PLACEHOLDER.fullmatch("{" + str(name) + "}"):
                problem = "a name is letters, digits and _, not starting with a digit"
            elif not isinstance(entry, dict) or entry.get("type") not in studies.TYPES:
                problem = f'its "type" is one of {", ".join(studies.TYPES)}'
            else:
                cleaned[name], problem = _entry(entry)
            if problem:
                self._refuse("space", f"{name}: {problem}.")
        return cleaned

    def _objective(self):
        objective = self.data.get("objective")
        if not isinstance(objective, dict):
            self._refuse("objective", 'Give {"metric": "<name>", "direction": "minimize" | "maximize"}.')
            return None
        metric, direction = objective.get("metric"), objective.get("direction", "minimize")
        if not isinstance(metric, str) or not metric.strip() or len(metric) > 100 or text_problem(metric):
            self._refuse("objective", "metric: the name of a metric the trials report (RINGMASTER_METRIC lines "
                                      "or TensorBoard scalars), at most 100 characters.")
        if direction not in studies.DIRECTIONS:
            self._refuse("objective", f"direction: one of {', '.join(studies.DIRECTIONS)}.")
        unknown = sorted(set(objective) - {"metric", "direction"})
        if unknown:
            self._refuse("objective", f"Unknown: {', '.join(map(str, unknown))}.")
        return {"metric": metric.strip() if isinstance(metric, str) else metric, "direction": direction}

    def _integer(self, field, *, required=False, default=None, most):
        value = self.data.get(field, default)
        if value is None and required:
            self._refuse(field, "Required: a whole number of at least 1.")
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            self._refuse(field, f"A whole number from 1 to {most}.")
        return value

    def _choice(self, field, choices, default):
        value = self.data.get(field, default)
        if value not in choices:
            self._refuse(field, f"One of {', '.join(choices)}.")
        return value

    def _placeholders(self, spec):
        used, given = studies.placeholders(spec["base"]), set(spec["space"])
        for name in sorted(used - given):
            self._refuse("space", f"The base uses {{{name}}} but the space has no entry {name}.")
        for name in sorted(given - used):
            self._refuse("space", f"{name}: no placeholder {{{name}}} in the base's args or env uses it.")

    def _grid(self, spec):
        if spec["sampler"] != "grid":
            return
        floats = [name for name, entry in spec["space"].items() if entry["type"] == "float"]
        if floats:
            self._refuse("sampler", f"The grid sampler needs int ranges or categorical choices; "
                                    f"{', '.join(floats)} {'is a float range' if len(floats) == 1 else 'are float ranges'}.")
        elif studies.grid_size(spec["space"]) > studies.MAX_GRID:
            self._refuse("sampler", f"The grid has more than {studies.MAX_GRID} points.")

    def _job(self, spec):
        """The base as a trial's job (a sample of the space in its placeholders) through JobForm;
        then the trials at once against the quota."""
        study = _Sample(spec)
        form = JobForm(data=studies.job_data(study, 0, studies.sample(spec["space"])), user=self.user)
        if not form.is_valid():
            for field, messages in form.errors.items():
                for message in messages:
                    self._refuse("base", f"{'non_field_errors' if field == '__all__' else field}: {message}")
            return
        data = form.cleaned_data
        problem = quotas.parallel_refusal(self.user, data.get("group"), data["backend"].name, data["gpus"],
                                          spec["parallel"])
        if problem:
            self._refuse("parallel", problem)


class _Sample:
    """What studies.job_data reads of a study, before it exists."""

    pk = 0

    def __init__(self, spec):
        self.name, self.spec = spec["name"], spec


def _number(value):
    """A number Optuna keeps exactly (its parameters are stored as floats)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_NUMBER \
        and math.isfinite(value)


def _entry(entry):
    """(the cleaned entry, None) or (None, what is wrong with it)."""
    kind = entry["type"]
    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices:
            return None, 'a categorical entry gives "choices": a non-empty list'
        if len(choices) > MAX_CHOICES or not all(isinstance(c, SCALARS) for c in choices):
            return None, f"choices are at most {MAX_CHOICES} strings, numbers or booleans"
        if any(isinstance(c, str) and text_problem(c) for c in choices):
            return None, "a choice is not storable text"
        if len(set(map(repr, choices))) != len(choices):
            return None, "the choices repeat a value"
        return {"type": kind, "choices": choices}, None
    low, high, log = entry.get("low"), entry.get("high"), entry.get("log", False)
    if kind == "int" and not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        return None, 'an int range gives whole numbers "low" and "high"'
    if not (_number(low) and _number(high)):
        return None, f'a range gives numbers "low" and "high" (at most {MAX_NUMBER} either way)'
    if not isinstance(log, bool):
        return None, '"log" is true or false'
    if low > high:
        return None, f"the range is empty (low {low} > high {high})"
    if log and low <= 0:
        return None, f"a log range needs low > 0 (it is {low})"
    return {"type": kind, "low": low, "high": high, "log": log}, None
