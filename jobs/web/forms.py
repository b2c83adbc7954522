"""Validation of everything a user submits. One path for the HTML form, the API and the CLI.

JobForm takes API-shaped data (args a list, env a mapping) and nothing else; JobPageForm
(jobs.web.pageform), the browser's form, accepts the same fields typed as text (args split like a command line, env as
NAME=value lines) and turns them into those shapes before the same checks run.
"""
import hashlib
import re
import shlex

from django import forms
from django.conf import settings
from django.db.models import Q

from jobs import backends
from jobs.domain import projects, quotas, sourcecheck
from jobs.domain.services import visible_scripts
from jobs.web.params import plain_digits, text_problem
from jobs.models import RESTART_CAUSES, GitCredential, Image
from runners import launchers

MAX_SCRIPT_BYTES = 1024 * 1024
MAX_ARGS = 1000
MAX_ARG_CHARS = 8192
MAX_ENV = 500
MAX_PRIORITY = 1000
MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_NOTE_CHARS = 10_000
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED_ENV_PREFIX = "RINGMASTER_"
# Variables that the dynamic loader, the C library or a shell take as instructions (code to load,
# files to read, commands to run) rather than as data: refused in every job, on every backend.
# (PYTHON* are allowed: they reach the job's own Python only.)
REFUSED_ENV_PREFIXES = ("LD_", "BASH_FUNC_")
REFUSED_ENV = frozenset({
    "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "RES_OPTIONS",
    "LOCALDOMAIN", "MALLOC_CHECK_", "MALLOC_TRACE", "MALLOC_PERTURB_",
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "PROMPT_COMMAND",
})


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
        problems = [problem for name, val in value.items() for problem in variable_problems(name, val)]
        if problems:
            raise forms.ValidationError(problems)


def variable_problems(name, value):
    """What is wrong with one environment variable ([] if nothing): every bad one is reported."""
    for text, what in ((name, "A variable name"), (value, f"The value of {name}")):
        try:
            _no_nul(text, what)
        except forms.ValidationError as exc:
            return exc.messages
    if not ENV_NAME.match(name):
        return [f"{name!r} is not a valid variable name (letters, digits and _, not starting with a digit)."]
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        return [f"{name}: names starting with {RESERVED_ENV_PREFIX} are reserved."]
    if name.startswith(REFUSED_ENV_PREFIXES) or name in REFUSED_ENV:
        return [f"{name} is refused: the dynamic loader, the C library or a shell would take it as an instruction."]
    return []


class EnvTextField(StringMapField):
    """The browser's environment box: one NAME=value per line; every bad line is reported."""

    def to_python(self, value):
        if isinstance(value, str):
            mapping, problems, seen = {}, [], {}
            for number, line in enumerate(value.splitlines(), start=1):
                if not line.strip():
                    continue
                if "=" not in line:
                    problems.append(f"Line {number}: expected NAME=value.")
                    continue
                name, _, val = line.partition("=")
                name = name.strip()
                problems += [f"Line {number}: {problem}" for problem in variable_problems(name, val)]
                if name in seen:
                    problems.append(f"Line {number}: {name} is already set on line {seen[name]}.")
                seen.setdefault(name, number)
                mapping[name] = val
            if problems:
                raise forms.ValidationError(problems)
            value = mapping
        return super().to_python(value)


def clean_tag(value):
    """One tag, its whitespace collapsed to single spaces, or a ValidationError saying why not."""
    if not isinstance(value, str):
        raise forms.ValidationError("Must be a list of strings.")
    _no_nul(value, "A tag")
    tag = " ".join(value.split())
    if not tag:
        raise forms.ValidationError("A tag cannot be empty.")
    if "," in tag:
        raise forms.ValidationError(f"A tag cannot contain a comma ({tag!r}): commas separate tags on the job page.")
    if len(tag) > MAX_TAG_CHARS:
        raise forms.ValidationError(f"A tag is at most {MAX_TAG_CHARS} characters ({tag[:20]!r}... is {len(tag)}).")
    return tag


def clean_tags(values):
    """Tags as stored: each cleaned by clean_tag, duplicates dropped (the first kept), at most MAX_TAGS."""
    tags = list(dict.fromkeys(clean_tag(value) for value in values))
    if len(tags) > MAX_TAGS:
        raise forms.ValidationError(f"At most {MAX_TAGS} tags per job ({len(tags)} given).")
    return tags


class TagListWidget(forms.TextInput):
    """Reads every value of a repeated form field (tags=a&tags=b), a JSON list as it is."""

    def value_from_datadict(self, data, files, name):
        if hasattr(data, "getlist") and name in data:
            return data.getlist(name)
        return data.get(name)


class TagListField(forms.Field):
    """A job's tags (the API's shape: a list of strings), as clean_tags() stores them."""

    widget = TagListWidget

    def to_python(self, value):
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise forms.ValidationError("Must be a list of strings.")
        return clean_tags(value)


class TagsTextField(TagListField):
    """The job page's tags box: tags separated by commas."""

    widget = forms.TextInput

    def to_python(self, value):
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        return super().to_python(value)


class NoteField(forms.CharField):
    """Free text about a job: why it was run, what came of it."""

    def __init__(self, **kwargs):
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3}))
        super().__init__(max_length=MAX_NOTE_CHARS, required=False, strip=True, **kwargs)

    def to_python(self, value):
        if value is not None and not isinstance(value, str):
            raise forms.ValidationError("Must be a string.")
        value = super().to_python(value)
        _no_nul(value, "The note")
        return value


RECOVERY_FIELDS = {"max_restarts", "restart_on_exit_codes", "restart_on"}


class ExitCodesField(forms.Field):
    """Exit codes (the API's shape: a list of integers, 1 to 255)."""

    def to_python(self, value):
        if value in (None, ""):
            return []
        if not isinstance(value, (list, tuple)):
            raise forms.ValidationError("Must be a list of exit codes, e.g. [137].")
        for code in value:
            if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
                raise forms.ValidationError(f"{code!r} is not an exit code that fails a job (1 to 255).")
        return sorted(set(value))


class ExitCodesTextField(ExitCodesField):
    """The page's: exit codes separated by commas or spaces."""

    def to_python(self, value):
        if isinstance(value, str):
            words = value.replace(",", " ").split()
            if not all(plain_digits(word) and len(word) <= 3 for word in words):
                raise forms.ValidationError("Give exit codes as numbers separated by commas, e.g. 137, 139.")
            value = [int(word) for word in words]
        return super().to_python(value)


class RestartCausesField(forms.Field):
    """Causes besides an exit code that earn a restart (the API's shape: a list of names)."""

    def to_python(self, value):
        if value in (None, ""):
            return []
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise forms.ValidationError("Must be a list of causes, e.g. [\"oom\"].")
        unknown = [item for item in value if item not in RESTART_CAUSES]
        if unknown:
            raise forms.ValidationError(f"No restart cause {unknown[0]!r}; the causes are "
                                        f"{', '.join(RESTART_CAUSES)}.")
        return [cause for cause in RESTART_CAUSES if cause in value]


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


class GitField(forms.Field):
    """A git repository at a ref (the API's shape): {"url", "ref"}, and for a private repository
    "credential" (the id of one of the user's git credentials) or "token" (https: used for the
    fetch at submit only, never kept, never shown)."""

    KEYS = ("url", "ref", "token", "credential")

    def to_python(self, value):
        if value in (None, "", {}):
            return None
        if not isinstance(value, dict):
            raise forms.ValidationError('Must be an object: {"url": ..., "ref": ...}.')
        unknown = sorted(str(key) for key in value if key not in self.KEYS)
        if unknown:
            raise forms.ValidationError(f"Unknown key {unknown[0]!r}: git takes url, ref and token.")
        if not all(isinstance(value.get(key, ""), str) for key in ("url", "ref", "token")):
            raise forms.ValidationError("url, ref and token must be strings.")
        credential = value.get("credential")
        if credential is not None and (isinstance(credential, bool) or not isinstance(credential, int)
                                       or not 0 < credential < 2 ** 31):
            raise forms.ValidationError("credential must be the id of one of your git credentials.")
        token = value.get("token") or None
        if token is not None and (len(token) > 4096 or any(ord(c) < 0x21 or ord(c) == 0x7f for c in token)):
            raise forms.ValidationError("The token must be one word of printable characters.")
        try:
            url, ref = projects.git_source(value.get("url", "").strip(), value.get("ref", "").strip())
        except projects.BadGit as exc:
            raise forms.ValidationError(str(exc)) from None
        if token and url.scheme not in ("https", "http"):      # http: only where the site takes it, trusted
            raise forms.ValidationError("A token is sent only to https:// repositories.")
        if token and credential is not None:
            raise forms.ValidationError("Give a token or a credential, not both.")
        return {"url": url, "ref": ref, "token": token, "credential": credential}


class JobForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)
    image = ImageField()
    gpus = forms.IntegerField(min_value=1, max_value=2 ** 31 - 1, label="GPUs")   # the column; each backend has its own limit
    max_gpus = forms.IntegerField(
        required=False, min_value=1, max_value=2 ** 31 - 1, label="Most GPUs (elastic)",
        help_text="Makes the job elastic: it starts at GPUs, grows up to this many when GPUs are free and "
                  "shrinks back when other jobs need them. A Horovod script uses hvd.elastic (see "
                  "elastic_train.py); torchrun restarts every worker at each change, so a torchrun script "
                  "resumes from its own checkpoint (see elastic_ddp_train.py). Kubernetes resizes Horovod "
                  "jobs only. Empty: one size for the whole run.")
    script = forms.IntegerField(required=False, min_value=1)
    script_path = forms.CharField(max_length=1024, required=False, strip=False, label="Script path")
    project = forms.IntegerField(required=False, min_value=1,
                                 help_text="A project uploaded as an archive (POST /api/projects/): its id.")
    git = GitField(required=False, help_text='Or a git repository at a branch, tag or commit: {"url", "ref"}, '
                                             'fetched by the portal at submit.')
    entry_point = forms.CharField(max_length=1024, required=False, strip=False, label="Entry point",
                                  help_text="The project's .py file the job runs, e.g. train.py or src/train.py; "
                                            "the working directory is the project's root.")
    args = StringListField(required=False)
    env = StringMapField(required=False)
    launcher = forms.CharField(
        max_length=20, required=False,
        help_text=" ".join(f"{info.label}: {info.expects}" for info in launchers.LAUNCHERS.values()) +
                  " Empty: the image's (Horovod where it carries both).")
    backend = forms.CharField(max_length=20, required=False,
                              help_text="An enabled backend; empty: the portal's default.")
    time_limit_minutes = forms.IntegerField(required=False, min_value=1, label="Time limit (minutes)")
    gpu_model = forms.CharField(max_length=100, required=False, label="GPU model",
                                help_text="Only GPUs whose name contains this, e.g. A100; empty: any.")
    group = forms.CharField(max_length=150, required=False,
                            help_text="The group (team) this job is charged to; empty: your default group.")
    priority = forms.IntegerField(required=False, min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY,
                                  help_text="Staff only. Higher runs first; default 0.")
    tags = TagListField(required=False)
    note = NoteField()
    checkpoint_pattern = forms.CharField(
        max_length=200, required=False, label="Checkpoint pattern",
        help_text="A glob naming the job's checkpoints among the files it writes under "
                  "RINGMASTER_OUTPUT_DIR, e.g. *.pt; a rerun from checkpoint gets the newest in "
                  "RINGMASTER_CHECKPOINT.")

    max_restarts = forms.IntegerField(
        required=False, min_value=0, max_value=2 ** 31 - 1, label="Restarts",
        help_text="How many times the job starts again after an attempt fails with one of the causes below, "
                  "from its newest checkpoint (the checkpoint pattern) in RINGMASTER_CHECKPOINT. 0: none; "
                  "empty, with no cause below: the image's default.")
    restart_on_exit_codes = ExitCodesField(required=False, label="Restart on exit codes")
    restart_on = RestartCausesField(required=False, label="Restart on",
                                    help_text="signal: a rank killed by a signal; oom: out of memory; "
                                              "lost_host: a host of the job lost; preempted: the job preempted.")

    # The fields that give the job's Python, in the order their source is looked at for warnings.
    SOURCE_FIELDS = ("entry_point", "script_file", "uploaded_script", "script")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.source_reports = {}     # field -> sourcecheck.Report of the Python it gives
        self.warnings = []           # what the job is created despite (launcher_warning), once valid
        self.backend_fields = set()              # the enabled backends' own (Backend.api_fields)
        for backend in backends.enabled():
            for name, field in backend.api_fields().items():
                if name not in self.base_fields:     # never in place of one of the form's own
                    self.fields.setdefault(name, field)
                    self.backend_fields.add(name)
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
        self.check_source("script", projects.script_report(script.name, script.content))
        return script

    def check_source(self, field, report):
        """Keep the report of the Python that `field` gives; a ValidationError naming each file
        and line that does not compile."""
        if report.problems:
            raise forms.ValidationError(sourcecheck.problem_text(report))
        self.source_reports[field] = report

    def clean_project(self):
        project_id = self.cleaned_data["project"]
        if project_id is None:
            return None
        project = projects.visible_projects(self.user).filter(pk=project_id).first()
        if project is None:
            raise forms.ValidationError(f"No project with id {project_id}. Upload it first (POST /api/projects/).")
        return project

    def clean_git(self):
        """The repository, with the user's own credential in place of its id."""
        git = self.cleaned_data["git"]
        if git is None or git["credential"] is None:
            return git
        credential = projects.visible_git_credentials(self.user).filter(pk=git["credential"]).first()
        if credential is None:
            raise forms.ValidationError(f"No git credential with id {git['credential']}. Add it first "
                                        f"(POST /api/git-credentials/).")
        problem = projects.credential_problem(credential, git["url"])
        if problem:
            raise forms.ValidationError(problem)
        return {**git, "credential": credential}

    def clean_script_path(self):
        path = self.cleaned_data["script_path"]
        _no_nul(path, "The script path")
        if "\n" in path or "\r" in path:
            raise forms.ValidationError("The script path must be one line.")
        return path.strip()

    def clean_launcher(self):
        """A launcher's name, or None: the image's decides (in clean())."""
        name = (self.cleaned_data["launcher"] or "").strip()
        if name and name not in launchers.LAUNCHERS:
            raise forms.ValidationError(f"Select a valid choice. {name} is not one of the available choices "
                                        f"({', '.join(launchers.LAUNCHERS)}).")
        return name or None

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
        script, path, project = data.get("script"), data.get("script_path"), data.get("project")
        if not {"script", "script_path", "project", "git"} & set(self.errors):
            given = sum(bool(source) for source in (script, path, self._has_upload(), project, data.get("git")))
            if given > 1:
                self.add_error("script", "Give only one of: a script from the library, an uploaded file, a script "
                                         "path, a project, a git repository.")
            elif given == 0:
                self.add_error("script", "Choose a script: upload one, pick one from the library, "
                                         "give the path of a script inside the image, or give a project.")
            elif data.get("git"):
                self._fetch_git(data)
        self._clean_entry_point(data)
        backend, gpus = data.get("backend"), data.get("gpus")
        self._clean_launcher(data)
        most = data.get("max_gpus")
        if most is not None and gpus and "gpus" not in self.errors:
            if most < gpus:
                self.add_error("max_gpus", f"Most GPUs must be at least GPUs ({gpus}).")
            elif most == gpus:
                data["max_gpus"] = None                   # one size: not elastic
        self._clean_backend_fields(backend, data)
        self._clean_recovery(backend, data)
        if backend is not None:
            backend.clean(self, data)
            if data.get("project") and not backend.runs_projects and "project" not in self.errors:
                able = [b.label for b in backends.enabled() if b.runs_projects]
                self.add_error("project", f"{backend.label} cannot run projects yet"
                                          f"{'; ' + ', '.join(able) + ' can' if able else ''}.")
            most = data.get("max_gpus")
            if most is not None and "max_gpus" not in self.errors and "launcher" not in self.errors \
                    and (problem := backend.max_gpus_problem(most, data.get("launcher"))):
                self.add_error("max_gpus", problem)
        if backend and gpus and "gpus" not in self.errors and "group" not in self.errors:
            # A job that can never fit its quota is refused now, naming the limit, not queued forever.
            problem = quotas.refusal(self.user, data.get("group"), backend.name, gpus)
            if problem:
                self.add_error("gpus", problem)
        if not self.errors:
            self._warn(data)
        return data

    def _clean_backend_fields(self, backend, data):
        """Backends' own fields: text that can be stored, empty as None, and none given that the
        job's backend does not take."""
        own = set(backend.api_fields()) if backend is not None else set()
        for name in sorted(self.backend_fields):
            value = data.get(name)
            if isinstance(value, str):
                value = data[name] = value.strip() or None
                if value is not None and (problem := text_problem(value)):
                    self.add_error(name, f"The {name} {problem}.")
                    continue
            if backend is not None and value is not None and name not in own and name not in self.errors:
                self.add_error(name, f"The {backend.name} backend takes no {name}.")

    def _clean_launcher(self, data):
        """The job's launcher: one its image carries (the image's first, Horovod before torchrun,
        where none is given), that its backend can start."""
        image, name = data.get("image"), data.get("launcher")
        if image is None or "launcher" in self.errors:
            return
        carried = image.launcher_names()
        if name is None:
            name = next((known for known in launchers.LAUNCHERS if known in carried), launchers.DEFAULT)
        elif name not in carried:
            self.add_error("launcher", f"The image {image.name} carries {' and '.join(carried)}, not {name}: "
                                       f"pick another launcher or an image with {name}.")
            return
        data["launcher"] = name
        backend = data.get("backend")
        if backend is not None and name not in backend.launchers:
            able = [b.label for b in backends.enabled() if name in b.launchers]
            self.add_error("launcher", f"{backend.label} cannot start {launchers.LAUNCHERS[name].label} jobs yet"
                                       f"{'; ' + ', '.join(able) + ' can' if able else ''}.")

    def _fetch_git(self, data):
        """The repository fetched now, at its ref, as the job's project (and its commit)."""
        git = data["git"]
        try:
            data["project"], data["project_commit"] = projects.store_git(
                self.user, git["url"], git["ref"], token=git["token"], credential=git["credential"])
        except (projects.BadGit, projects.BadProject) as exc:
            self.add_error("git", str(exc))
            return
        data["project_url"] = git["url"].text

    def _clean_entry_point(self, data):
        """A project's entry point: a .py file in it; none without a project."""
        project, entry = data.get("project"), (data.get("entry_point") or "").strip()
        if {"project", "entry_point", "git"} & set(self.errors):
            return
        if project is None:
            if entry:
                self.add_error("entry_point", "An entry point goes with a project; give project too.")
            return
        if not entry:
            self.add_error("entry_point", "Name the project's .py file the job runs, e.g. train.py.")
            return
        problem = projects.entry_point_problem(project, entry)
        if problem:
            self.add_error("entry_point", problem)
            return
        data["entry_point"] = projects.clean_entry_point(entry)
        try:
            self.check_source("entry_point", projects.source_report(project, data["entry_point"]))
        except forms.ValidationError as exc:
            self.add_error("entry_point", exc)
        image = data.get("image")
        if image is not None and (problem := projects.requirements_problem(project, image, data.get("backend"))):
            self.add_error("project", problem)

    def _warn(self, data):
        """What the job is created despite: a script written for another launcher than its own."""
        given = [field for field in self.SOURCE_FIELDS if field in self.source_reports]
        report = self.source_reports[given[0]] if given else None
        if report is None:                     # a script inside the image: not read
            return
        checked = data["gpus"] > 1 and not data.get("max_gpus")       # runners.base.JobSpec.world_size_env
        warning = sourcecheck.launcher_warning(report, data["launcher"], checked)
        self.warnings = [warning] if warning else []

    def _has_upload(self):
        return False

    def job_fields(self):
        """The cleaned data as Job model fields."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "image": data["image"],
            "gpus": data["gpus"],
            "max_gpus": data.get("max_gpus"),
            "script": data["script"],
            "script_path": data["script_path"] if not data["script"] else "",
            "project": data.get("project"),
            "entry_point": (data.get("entry_point") or "") if data.get("project") else "",
            "project_url": data.get("project_url") or "",
            "project_commit": data.get("project_commit") or "",
            "args": data["args"],
            "env": data["env"],
            "launcher": data["launcher"],
            "backend": data["backend"].name,
            "time_limit_minutes": data["time_limit_minutes"],
            "gpu_model": data.get("gpu_model") or "",
            "charged_group": data.get("group"),      # absent on the page of a user in no group
            "priority": data.get("priority") or 0,   # absent on a non-staff user's page
            "tags": data.get("tags") or [],
            "note": data.get("note") or "",
            "checkpoint_pattern": data.get("checkpoint_pattern") or "",
            "max_restarts": data.get("max_restarts") or 0,
            "restart_on_exit_codes": data.get("restart_on_exit_codes") or [],
            "restart_on": data.get("restart_on") or [],
        }

    def clean_max_restarts(self):
        restarts = self.cleaned_data["max_restarts"] or 0
        cap = settings.RINGMASTER_MAX_RESTARTS_CAP
        if restarts > cap:
            raise forms.ValidationError(f"At most {cap} restarts per job on this portal (RINGMASTER_MAX_RESTARTS_CAP).")
        return restarts

    def _clean_recovery(self, backend, data):
        """Restarts only on a backend that restarts jobs (Backend.restarts_jobs), and only with a
        cause to restart on. A job that asks for no restarts and names no cause, on such a
        backend, gets its image's policy (Image.default_max_restarts)."""
        image = data.get("image")
        given = self.data.get(self.add_prefix("max_restarts")) not in (None, "") or data.get("restart_on_exit_codes") \
            or data.get("restart_on")
        if not given and image is not None and image.default_max_restarts and backend is not None \
                and backend.restarts_jobs and not RECOVERY_FIELDS & set(self.errors):
            data.update(max_restarts=image.default_max_restarts,
                        restart_on_exit_codes=list(image.default_restart_on_exit_codes),
                        restart_on=list(image.default_restart_on))
        if not data.get("max_restarts") or "max_restarts" in self.errors:
            return
        if backend is not None and not backend.restarts_jobs:
            able = [b.label for b in backends.enabled() if b.restarts_jobs]
            self.add_error("max_restarts", f"{backend.label} cannot restart jobs yet"
                                           f"{'; ' + ', '.join(able) + ' can' if able else ''}.")
        elif not data.get("restart_on_exit_codes") and not data.get("restart_on") \
                and not {"restart_on_exit_codes", "restart_on"} & set(self.errors):
            self.add_error("max_restarts", "Name what earns a restart: exit codes (restart_on_exit_codes) "
                                           "or causes (restart_on).")

    def clean_checkpoint_pattern(self):
        pattern = (self.cleaned_data.get("checkpoint_pattern") or "").strip()
        if "\0" in pattern or pattern.startswith("/") or ".." in pattern.split("/"):
            raise forms.ValidationError("A checkpoint pattern is a glob relative to the output folder, e.g. *.pt.")
        return pattern


class JobNotesForm(forms.Form):
    """What can change after a job is submitted, by whoever may see it (its owner, staff): its
    tags and its note. Only the fields present in `data` are checked and changed (a PATCH);
    anything else in `data` is refused, named."""

    tags = TagListField(required=False)
    note = NoteField()

    def __init__(self, data, *, partial=True, **kwargs):
        super().__init__(data, **kwargs)
        self.unknown = sorted(str(name) for name in data if name not in self.fields) if partial else []
        if partial:
            for name in [name for name in self.fields if name not in data]:
                del self.fields[name]

    def clean(self):
        data = super().clean()
        for name in self.unknown:
            self._errors[name] = self.error_class(["Only tags and note can be changed."])
        return data

    def changes(self):
        """The cleaned fields, as Job model fields."""
        return {name: self.cleaned_data[name] for name in self.fields}


class JobNotesPageForm(JobNotesForm):
    """The job page's form: tags typed as one line, separated by commas; both fields always sent."""

    tags = TagsTextField(required=False, help_text="Separated by commas.")

    def __init__(self, data=None, **kwargs):
        super().__init__(data, partial=False, **kwargs)


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


class ProjectUploadForm(forms.Form):
    """A project as an archive (.zip or .tar.gz), read as untrusted (runners.projects): `file`
    cleans to the archive's bytes, within the site's limit on its size."""

    file = forms.FileField()

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = projects.limits().archive_bytes
        if upload.size > limit:
            raise forms.ValidationError(f"The archive is {upload.size:,} bytes; at most {limit:,} are taken.")
        return upload.read(limit + 1)


class GitCredentialForm(forms.Form):
    """A credential for private git repositories: a token, or an SSH deploy key (given, or made
    by the portal where none is given)."""

    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=GitCredential.Kind.choices)
    secret = forms.CharField(max_length=20_000, required=False, strip=False,
                             help_text="The token; or the SSH private key (unencrypted, OpenSSH or PEM); "
                                       "none for an SSH key: the portal makes one and shows its public half.")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        _no_nul(name, "The name")
        if projects.visible_git_credentials(self.user).filter(name=name).exists():
            raise forms.ValidationError(f"You have a git credential named {name!r} already.")
        return name

    def clean(self):
        data = super().clean()
        kind, secret = data.get("kind"), (data.get("secret") or "").strip()
        if text_problem(secret):
            self.add_error("secret", f"The secret {text_problem(secret)}.")
        elif kind == GitCredential.Kind.TOKEN and (not secret or any(ord(c) < 0x21 or ord(c) == 0x7f for c in secret)
                                                 or len(secret) > 4096):
            self.add_error("secret", "Give the token: one word of printable characters.")
        elif kind == GitCredential.Kind.SSH_KEY and secret:
            try:
                projects.read_ssh_key(secret)
            except ValueError as exc:
                self.add_error("secret", str(exc))
        data["secret"] = secret
        return data

    def save(self):
        data = self.cleaned_data
        return projects.add_git_credential(self.user, data["name"], data["kind"], data["secret"])


def safe_script_name(name):
    """The file's base name, with anything but letters, digits, '.', '-' and '_' made '_'."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")
    return base[:200]
