"""Validation of everything a user submits. One path for the HTML form, the API and the CLI.

JobForm takes API-shaped data (args a list, env a mapping) and nothing else; JobPageForm, the
browser's form, accepts the same fields typed as text (args split like a command line, env as
NAME=value lines) and turns them into those shapes before the same checks run.
"""
import hashlib
import re
import shlex

from django import forms
from django.conf import settings
from django.db.models import Q

from jobs import backends
from jobs.domain import quotas
from jobs.web.params import plain_digits, text_problem
from jobs.models import Image, Script

MAX_SCRIPT_BYTES = 1024 * 1024
MAX_ARGS = 1000
MAX_ARG_CHARS = 8192
MAX_ENV = 500
MAX_PRIORITY = 1000
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED_ENV_PREFIX = "RINGMASTER_"


def _no_nul(value, what):
    """Text that can be stored: no NUL byte, no lone surrogate (jobs.web.params)."""
    problem = text_problem(value)
    if problem:
        raise forms.ValidationError(f"{what} {problem}.")


class StringListField(forms.Field):
    """A list of strings (the API's shape)."""

    def to_python(self, value):
        if value in (None, ""):
            return []
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise forms.ValidationError("Must be a list of strings.")
        return list(value)

    def validate(self, value):
        super().validate(value)
        if len(value) > MAX_ARGS:
            raise forms.ValidationError(f"At most {MAX_ARGS} arguments.")
        for item in value:
            _no_nul(item, "An argument")
            if len(item) > MAX_ARG_CHARS:
                raise forms.ValidationError(f"An argument is longer than {MAX_ARG_CHARS} characters.")


class ArgsTextField(StringListField):
    """The browser's arguments box: split like a command line (by shlex; no shell runs)."""

    def to_python(self, value):
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:
                raise forms.ValidationError(f"Could not split the arguments: {exc}.")
        return super().to_python(value)


class StringMapField(forms.Field):
    """A mapping of variable names to strings (the API's shape)."""

    def to_python(self, value):
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be an object mapping names to strings.")
        for name, val in value.items():
            if not isinstance(val, str):
                raise forms.ValidationError(f"The value of {name} must be a string.")
        return dict(value)

    def validate(self, value):
        super().validate(value)
        if len(value) > MAX_ENV:
            raise forms.ValidationError(f"At most {MAX_ENV} variables.")
        for name, val in value.items():
            _no_nul(name, "A variable name")
            if not ENV_NAME.match(name):
                raise forms.ValidationError(
                    f"{name!r} is not a valid variable name (letters, digits and _, not starting with a digit)."
                )
            if name.upper().startswith(RESERVED_ENV_PREFIX):
                raise forms.ValidationError(f"{name}: names starting with {RESERVED_ENV_PREFIX} are reserved.")
            _no_nul(val, f"The value of {name}")


class EnvTextField(StringMapField):
    """The browser's environment box: one NAME=value per line."""

    def to_python(self, value):
        if isinstance(value, str):
            mapping = {}
            for number, line in enumerate(value.splitlines(), start=1):
                if not line.strip():
                    continue
                if "=" not in line:
                    raise forms.ValidationError(f"Line {number}: expected NAME=value.")
                name, _, val = line.partition("=")
                mapping[name.strip()] = val
            value = mapping
        return super().to_python(value)


class ImageField(forms.Field):
    """An enabled image of the catalog, given by name or by id."""

    def to_python(self, value):
        if value in (None, ""):
            return None
        if isinstance(value, Image):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise forms.ValidationError("Give the image's name or id.")
        if isinstance(value, int) and not 0 < value < 2 ** 31:
            raise forms.ValidationError(f"No image with id {value}.")
        if isinstance(value, str):
            _no_nul(value, "The image")
        query = Q(name=str(value))
        if isinstance(value, int) or (plain_digits(value) and int(value) < 2 ** 31):
            query |= Q(pk=int(value))
        image = Image.objects.filter(query, enabled=True).first()
        if image is None:
            names = ", ".join(Image.objects.filter(enabled=True).values_list("name", flat=True))
            raise forms.ValidationError(f"No enabled image {value!r}. Available: {names or 'none'}.")
        return image


def visible_scripts(user):
    """The scripts a user may run: their own uploads and the example library."""
    return Script.objects.filter(Q(owner=user) | Q(owner__isnull=True))


class JobForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)
    image = ImageField()
    gpus = forms.IntegerField(min_value=1, max_value=2 ** 31 - 1, label="GPUs")   # the column; each backend has its own limit
    script = forms.IntegerField(required=False, min_value=1)
    script_path = forms.CharField(max_length=1024, required=False, strip=False, label="Script path")
    args = StringListField(required=False)
    env = StringMapField(required=False)
    backend = forms.CharField(max_length=20, required=False,
                              help_text="An enabled backend; empty: the portal's default.")
    cluster = forms.CharField(max_length=100, required=False,
                              help_text="Kubernetes backend: the cluster (name); empty: the only one there is.")
    time_limit_minutes = forms.IntegerField(required=False, min_value=1, label="Time limit (minutes)")
    gpu_model = forms.CharField(max_length=100, required=False, label="GPU model",
                                help_text="Only GPUs whose name contains this, e.g. A100; empty: any.")
    group = forms.CharField(max_length=150, required=False,
                            help_text="The group (team) this job is charged to; empty: your default group.")
    priority = forms.IntegerField(required=False, min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY,
                                  help_text="Staff only. Higher runs first; default 0.")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        if settings.RINGMASTER_MAX_GPUS_PER_JOB is not None:
            self.fields["gpus"].widget.attrs["max"] = settings.RINGMASTER_MAX_GPUS_PER_JOB
        self.fields["time_limit_minutes"].widget.attrs["max"] = settings.RINGMASTER_MAX_TIME_LIMIT_MINUTES

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        _no_nul(name, "The name")
        return name

    def clean_gpus(self):
        gpus = self.cleaned_data["gpus"]
        limit = settings.RINGMASTER_MAX_GPUS_PER_JOB
        if limit is not None and gpus > limit:
            raise forms.ValidationError(f"At most {limit} GPUs per job on this portal (RINGMASTER_MAX_GPUS_PER_JOB).")
        return gpus

    def clean_script(self):
        script_id = self.cleaned_data["script"]
        if script_id is None:
            return None
        script = visible_scripts(self.user).filter(pk=script_id).first()
        if script is None:
            raise forms.ValidationError(f"No script with id {script_id}. Upload it first (POST /api/scripts/).")
        return script

    def clean_script_path(self):
        path = self.cleaned_data["script_path"]
        _no_nul(path, "The script path")
        if "\n" in path or "\r" in path:
            raise forms.ValidationError("The script path must be one line.")
        return path.strip()

    def clean_backend(self):
        """An enabled backend (by name); the backend itself checks the rest in clean()."""
        name = (self.cleaned_data["backend"] or "").strip() or settings.RINGMASTER_DEFAULT_BACKEND
        try:
            backend = backends.get(name)
        except backends.UnknownBackend:
            raise forms.ValidationError(f"Select a valid choice. {name} is not one of the available choices "
                                        f"({', '.join(backends.names()) or 'none'}).")
        problem = backend.unavailable()
        if problem:
            raise forms.ValidationError(problem)
        return backend

    def clean_cluster(self):
        """Where the job runs, for a backend with several places (resolved by that backend)."""
        value = (self.cleaned_data["cluster"] or "").strip()
        _no_nul(value, "The cluster")
        return value or None

    def clean_gpu_model(self):
        value = (self.cleaned_data["gpu_model"] or "").strip()
        _no_nul(value, "The GPU model")
        return value

    def clean_group(self):
        """A group the user belongs to, by name; none given: the user's default group."""
        name = (self.cleaned_data["group"] or "").strip()
        _no_nul(name, "The group")
        groups = quotas.groups_of(self.user)
        if not name:
            return quotas.default_group(self.user, groups)
        group = next((g for g in groups if g.name == name), None)
        if group is None:
            mine = ", ".join(g.name for g in groups) or "none"
            raise forms.ValidationError(f"You are not a member of group {name!r}. Your groups: {mine}.")
        return group

    def clean_priority(self):
        priority = self.cleaned_data["priority"]
        if priority not in (None, 0) and not self.user.is_staff:
            raise forms.ValidationError("Only staff may set a priority.")
        return priority or 0

    def clean_time_limit_minutes(self):
        minutes = self.cleaned_data["time_limit_minutes"] or settings.RINGMASTER_DEFAULT_TIME_LIMIT_MINUTES
        limit = settings.RINGMASTER_MAX_TIME_LIMIT_MINUTES
        if minutes > limit:
            raise forms.ValidationError(f"At most {limit} minutes.")
        return minutes

    def clean(self):
        data = super().clean()
        script, path = data.get("script"), data.get("script_path")
        if "script" not in self.errors and "script_path" not in self.errors:
            given = sum(bool(source) for source in (script, path, self._has_upload()))
            if given > 1:
                self.add_error("script", "Give only one of: a script from the library, an uploaded file, a script path.")
            elif given == 0:
                self.add_error("script", "Choose a script (upload one, pick one from the library) or give script_path.")
        backend, gpus = data.get("backend"), data.get("gpus")
        if backend is not None:
            backend.clean(self, data)
        if backend and gpus and "gpus" not in self.errors and "group" not in self.errors:
            # A job that can never fit its quota is refused now, naming the limit, not queued forever.
            problem = quotas.refusal(self.user, data.get("group"), backend.name, gpus)
            if problem:
                self.add_error("gpus", problem)
        return data

    def _has_upload(self):
        return False

    def job_fields(self):
        """The cleaned data as Job model fields."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "image": data["image"],
            "gpus": data["gpus"],
            "script": data["script"],
            "script_path": data["script_path"] if not data["script"] else "",
            "args": data["args"],
            "env": data["env"],
            "backend": data["backend"].name,
            **data["backend"].job_fields(data),
            "time_limit_minutes": data["time_limit_minutes"],
            "gpu_model": data.get("gpu_model") or "",
            "charged_group": data.get("group"),      # absent on the page of a user in no group
            "priority": data.get("priority") or 0,   # absent on a non-staff user's page
        }


class ScriptUploadForm(forms.Form):
    """A training script: a .py file up to 1 MiB of valid UTF-8."""

    file = forms.FileField()

    def clean_file(self):
        upload = self.cleaned_data["file"]
        name = safe_script_name(upload.name or "")
        if not name.endswith(".py"):
            raise forms.ValidationError("The script must be a .py file.")
        if upload.size > MAX_SCRIPT_BYTES:
            raise forms.ValidationError(f"The script is larger than {MAX_SCRIPT_BYTES // 1024} KiB.")
        raw = upload.read(MAX_SCRIPT_BYTES + 1)
        if len(raw) > MAX_SCRIPT_BYTES:
            raise forms.ValidationError(f"The script is larger than {MAX_SCRIPT_BYTES // 1024} KiB.")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise forms.ValidationError(f"The script is not valid UTF-8 (byte {exc.start}).")
        _no_nul(text, "The script")
        return {"name": name, "content": text, "sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}


def safe_script_name(name):
    """The file's base name, with anything but letters, digits, '.', '-' and '_' made '_'."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")
    return base[:200]


class JobPageForm(JobForm):
    """The browser's form: the same checks, friendlier widgets, and an optional upload."""

    image = forms.ModelChoiceField(queryset=Image.objects.filter(enabled=True), empty_label=None)
    script = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    script_file = forms.FileField(required=False, label="or upload a script (.py)")
    args = ArgsTextField(required=False, widget=forms.TextInput, label="Arguments",
                         help_text="Split like a command line; no shell runs them.")
    env = EnvTextField(required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Environment variables",
                       help_text="One NAME=value per line.")

    group = forms.TypedChoiceField(required=False, coerce=str, empty_value="", label="Charge to group")
    backend = forms.ChoiceField(required=False)

    field_order = ["name", "image", "gpus", "script", "script_file", "script_path", "args", "env", "backend",
                   "cluster", "gpu_model", "time_limit_minutes", "group", "priority"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        offered = [backend for backend in backends.enabled() if backend.offered()]
        del self.fields["cluster"]                 # a backend that has places adds its own field
        for backend in offered:
            self.fields.update(backend.page_fields())
        self.order_fields(self.field_order)
        scripts = visible_scripts(self.user).order_by("owner", "name")
        self.fields["script"].choices = [("", "—")] + [
            (s.pk, f"{s.name}{'' if s.owner_id else ' (example)'}") for s in scripts
        ]
        self.fields["backend"].choices = [(backend.name, backend.label) for backend in offered]
        self.fields["backend"].initial = settings.RINGMASTER_DEFAULT_BACKEND
        self._choose_fitting_image(offered)
        self.fields["gpus"].help_text = " ".join(note for note in (b.gpus_note() for b in offered) if note)
        self.fields["gpus"].initial = 2
        self.fields["script_path"].help_text = "Or a path to a script inside the image."
        groups = quotas.groups_of(self.user)
        if groups:
            default = quotas.default_group(self.user, groups)
            self.fields["group"].choices = [(g.name, g.name) for g in groups]
            self.fields["group"].initial = default.name
            self.fields["group"].help_text = "Its GPUs count against this group's quota as well as yours."
        else:
            del self.fields["group"]
        if not self.user.is_staff:
            del self.fields["priority"]

    def clean_image(self):
        return ImageField().clean(self.cleaned_data["image"])

    def _choose_fitting_image(self, offered):
        """The form opens on an image that runs on the backend it opens on."""
        default = next((b for b in offered if b.name == self.fields["backend"].initial), None)
        if default is not None:
            fitting = next((i for i in self.fields["image"].queryset if default.image_problem(i) is None), None)
            if fitting is not None:
                self.fields["image"].initial = fitting.pk

    def clean_cluster(self):
        return self.cleaned_data.get("cluster")

    def _has_upload(self):
        return bool(self.files.get("script_file"))

    def clean_script_file(self):
        upload = self.cleaned_data.get("script_file")
        if not upload:
            return None
        upload_form = ScriptUploadForm(files={"file": upload})
        if not upload_form.is_valid():
            raise forms.ValidationError(upload_form.errors["file"])
        return upload_form.cleaned_data["file"]
