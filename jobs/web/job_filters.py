"""The job list's filters, search and sort: read from the query string by a Django form, so a
link or a page number keeps them, and a value the form refuses is left out (and named on the
page), never a 500."""
from datetime import timedelta
from urllib.parse import urlencode

from django import forms
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from jobs import backends
from jobs.models import State
from jobs.web.forms import TagListField
from jobs.web.params import BIGINT, plain_digits, text_problem

# value -> (label, ordering). Every ordering ends in the id, so pages never overlap.
SORTS = {
    "newest": ("newest first", ("-created_at", "-id")),
    "oldest": ("oldest first", ("created_at", "id")),
    "gpus": ("most GPUs", ("-gpus", "-created_at", "-id")),
    "-gpus": ("fewest GPUs", ("gpus", "-created_at", "-id")),
    "longest": ("longest running", (F("duration").desc(nulls_last=True), "-id")),
    "shortest": ("shortest running", (F("duration").asc(nulls_last=True), "-id")),
}
# The column whose heading sorts, and the sort a second click gives.
COLUMN_SORTS = {"submitted": ("newest", "oldest"), "gpus": ("gpus", "-gpus"), "duration": ("longest", "shortest")}
FIELDS = ("q", "state", "backend", "owner", "mine", "tag", "sort")


class TagFilterField(TagListField):
    """?tag=a&tag=b: jobs with every one of these tags; empty values are left out."""

    def to_python(self, value):
        return super().to_python([tag for tag in value or [] if not isinstance(tag, str) or tag.strip()])


class JobFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=100, label="Name",
                        widget=forms.TextInput(attrs={"type": "search", "placeholder": "name or #id"}))
    state = forms.ChoiceField(required=False, choices=[("", "any state")] + list(State.choices))
    backend = forms.ChoiceField(required=False)
    owner = forms.CharField(required=False, max_length=150, label="Owner",
                            widget=forms.TextInput(attrs={"placeholder": "username"}))
    mine = forms.BooleanField(required=False)
    tag = TagFilterField(required=False, label="Tag")
    sort = forms.ChoiceField(required=False, choices=[(key, label) for key, (label, _) in SORTS.items()])

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["backend"].choices = [("", "any backend")] + [(b.name, b.label) for b in backends.enabled()]
        if not user.is_staff:              # a user sees only their own jobs: no owner to choose
            del self.fields["owner"], self.fields["mine"]

    def clean_q(self):
        return self._text("q")

    def clean_owner(self):
        return self._text("owner")

    def _text(self, name):
        value = self.cleaned_data[name].strip()
        problem = text_problem(value)
        if problem:
            raise forms.ValidationError(problem[0].upper() + problem[1:] + ".")
        return value

    def value(self, name):
        """The field's valid value, or empty (a refused value is left out)."""
        return (getattr(self, "cleaned_data", None) or {}).get(name) or ""

    def ignored(self):
        """What was refused, for the page: ["state: Select a valid choice...", ...]."""
        return [f"{self[name].label}: {' '.join(errors)}" for name, errors in self.errors.items()]

    def query(self, **changes):
        """The query string of the valid filters (and `changes`), for links: "?state=RUNNING&..."."""
        values = {name: self.value(name) for name in FIELDS if name in self.fields} | changes
        values = {name: ("1" if value is True else value) for name, value in values.items() if value}
        return "?" + urlencode(values, doseq=True) if values else "?"

    def tags(self):
        """The tags the list is filtered by."""
        return self.value("tag") or []

    def with_tag(self, tag):
        """The query string that also filters by `tag` (a tag clicked in a row)."""
        tags = self.tags()
        return self.query(tag=tags if tag in tags else [*tags, tag])

    def tag_removals(self):
        """[(tag, the query string without it)], for the tags the list is filtered by."""
        tags = self.tags()
        return [(tag, self.query(tag=[other for other in tags if other != tag])) for tag in tags]

    def filter(self, jobs, user):
        """`jobs` (already what the user may see) filtered, searched and sorted."""
        self.is_valid()
        if self.value("state"):
            jobs = jobs.filter(state=self.value("state"))
        if self.value("backend"):
            jobs = jobs.filter(backend=self.value("backend"))
        if self.value("owner"):
            jobs = jobs.filter(owner__username__iexact=self.value("owner"))
        if self.value("mine"):
            jobs = jobs.filter(owner=user)
        if self.tags():
            jobs = jobs.filter(tags__has_tags=self.tags())
        text = self.value("q")
        if text:
            by_id = text.removeprefix("#")
            match = Q(name__icontains=text)
            if plain_digits(by_id) and int(by_id) <= BIGINT[1]:
                match |= Q(pk=int(by_id))
            jobs = jobs.filter(match)
        if self.ordering in ("longest", "shortest"):
            jobs = jobs.annotate(duration=ExpressionWrapper(
                Coalesce(F("finished_at"), Now()) - F("started_at"), output_field=DurationField()))
        return jobs.order_by(*SORTS[self.ordering][1])

    @property
    def ordering(self):
        return self.value("sort") or "newest"

    def column_links(self):
        """{column: (url, arrow)}: each sortable heading's link (the other direction when it is
        the current sort) and ↓/↑ on the current one."""
        links = {}
        for column, (first, second) in COLUMN_SORTS.items():
            current = self.ordering in (first, second)
            target = second if self.ordering == first else first
            arrow = ("↓" if self.ordering == first else "↑") if current else ""
            links[column] = (self.query(sort=target), arrow)
        return links


def run_time(job, now=None):
    """How long the job ran (so far, while it runs); None before it starts."""
    if not job.started_at:
        return None
    return max((job.finished_at or now or timezone.now()) - job.started_at, timedelta(0))


def short_duration(delta):
    """45s, 3m 05s, 2h 03m, 3d 4h."""
    if delta is None:
        return ""
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"
