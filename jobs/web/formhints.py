"""What the browser's job form shows beside its fields: descriptions of the images and example
scripts to choose from, and the most GPUs one job may ask for on each backend.

The limits themselves are checked where they live (the backend's largest_job, the quotas'
per-job limit, the site's RINGMASTER_MAX_GPUS_PER_JOB in JobForm); this only tells the page.
"""
import ast
import json
from functools import lru_cache

from django import forms
from django.conf import settings
from django.utils.html import format_html

from jobs.domain import quotas


class DescribedSelect(forms.Select):
    """A select whose options have descriptions (`descriptions`: {value: text}): the chosen
    one's is shown in a hint below, which jobform.js keeps following the choice (all of them
    are in the select's data-descriptions)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.descriptions = {}

    def render(self, name, value, attrs=None, renderer=None):
        if not self.descriptions:
            return super().render(name, value, attrs, renderer)
        attrs = {**(attrs or {}), "data-descriptions": json.dumps(self.descriptions)}
        html = super().render(name, value, attrs, renderer)
        chosen = self.descriptions.get(str(value if value not in (None, "") else self._first_value()), "")
        element_id = attrs.get("id") or self.attrs.get("id") or f"id_{name}"
        return html + format_html('<small class="hint description" id="{}-description">{}</small>',
                                  element_id, chosen)

    def _first_value(self):
        for value, _ in self.choices:
            return value
        return ""


@lru_cache(maxsize=128)
def script_description(content):
    """The first paragraph of a script's module docstring, on one line ("" if it has none)."""
    try:
        doc = ast.get_docstring(ast.parse(content))
    except (SyntaxError, ValueError):
        return ""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def gpu_limits(user, offered, groups):
    """{backend name: {group name ("" for none): [most GPUs per job or None, what says so]}}."""
    by_quota = quotas.largest_jobs(user, groups, [backend.name for backend in offered])
    site = settings.RINGMASTER_MAX_GPUS_PER_JOB
    found = {}
    for backend in offered:
        capacity = backend.largest_job()
        found[backend.name] = {}
        for (group, name), quota in by_quota.items():
            if name != backend.name:
                continue
            bounds = [(capacity, "all it can hold"), (quota, "your quota" + (f" charged to {group}" if group else "")),
                      (site, "this portal's limit")]
            bounds = [(limit, why) for limit, why in bounds if limit is not None]
            if not bounds:
                found[backend.name][group] = [None, ""]
                continue
            most = min(limit for limit, _ in bounds)
            why = " and ".join(why for limit, why in bounds if limit == most)
            found[backend.name][group] = [most, f"At most {most} GPUs per job on {backend.label}: {why}."]
    return found


def limit_attrs(limits, backend, group):
    """The GPU input's attributes: max for the chosen backend and group, all of them for jobform.js."""
    most, text = limits.get(backend, {}).get(group or "", [None, ""])
    attrs = {"data-limits": json.dumps(limits)}
    if most is not None:
        attrs["max"] = most
    return attrs, text
