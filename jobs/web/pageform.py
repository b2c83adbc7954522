"""The browser's job form: JobForm's checks, with friendlier widgets (arguments as a command
line, environment variables as NAME=value lines), an optional upload kept across a refused try,
descriptions of the choices, the GPU field's maximum, and the job it reruns."""
import shlex

from django import forms
from django.conf import settings

from jobs import backends
from jobs.domain import projects, quotas
from jobs.domain.services import visible_jobs, visible_scripts
from jobs.models import Image, Script
from jobs.web import formhints
from jobs.web.formhints import DescribedSelect, script_description
from jobs.models import RESTART_CAUSES
from jobs.web.forms import (ArgsTextField, EnvTextField, ExitCodesTextField, ImageField, JobForm, NoteField,
                            ProjectUploadForm, ScriptUploadForm, TagsTextField)
from runners import launchers

GONE = "The script uploaded earlier is gone; upload it again."
NOT_YOURS = "The job this would rerun is not one of yours (or no longer exists); submit it as a new job."


class JobPageForm(JobForm):
    """The browser's form: the same checks, friendlier widgets, and an optional upload."""

    image = forms.ModelChoiceField(queryset=Image.objects.filter(enabled=True), empty_label=None,
                                   widget=DescribedSelect)
    script = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, widget=DescribedSelect)
    script_file = forms.FileField(required=False, label="or upload a script (.py)")
    # An upload kept from an earlier try of this form (the view stores a valid one when the
    # rest is refused), so the user need not choose the file again; a new file replaces it.
    uploaded_script = forms.IntegerField(required=False, min_value=1, max_value=2 ** 31 - 1, widget=forms.HiddenInput,
                                         error_messages=dict.fromkeys(("invalid", "min_value", "max_value"), GONE))
    # A project: an archive uploaded here (stored as the user's snapshot when the form is
    # checked), or the one of the job this form reruns.
    project = forms.IntegerField(required=False, min_value=1, max_value=2 ** 31 - 1, widget=forms.HiddenInput)
    project_file = forms.FileField(required=False, label="or upload a project (.zip, .tar.gz)",
                                   help_text="A folder of modules and files; name its entry point below.",
                                   widget=forms.ClearableFileInput(attrs={"accept": ".zip,.tar.gz,.tgz"}))
    git = None              # a git repository is the API's (POST /api/jobs/ with "git"), not the page's yet
    parent = forms.IntegerField(required=False, min_value=1, max_value=2 ** 31 - 1, widget=forms.HiddenInput,
                                error_messages=dict.fromkeys(("invalid", "min_value", "max_value"), NOT_YOURS))
    args = ArgsTextField(required=False, widget=forms.TextInput, label="Arguments",
                         help_text="Split like a command line; no shell runs them.")
    env = EnvTextField(required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Environment variables",
                       help_text="One NAME=value per line.")

    group = forms.TypedChoiceField(required=False, coerce=str, empty_value="", label="Charge to group")
    backend = forms.ChoiceField(required=False)
    launcher = forms.ChoiceField(required=False, choices=[("", "the image's")] + launchers.choices())
    tags = TagsTextField(required=False, help_text="Separated by commas; the job list filters by them.")
    note = NoteField(help_text="Why you run this job (shown on its page).")
    restart_on_exit_codes = ExitCodesTextField(required=False, widget=forms.TextInput, label="Restart on exit codes",
                                               help_text="Separated by commas, e.g. 137, 139.")
    restart_on = forms.MultipleChoiceField(
        required=False, choices=[(cause, cause) for cause in RESTART_CAUSES], widget=forms.CheckboxSelectMultiple,
        label="Restart on", help_text=JobForm.base_fields["restart_on"].help_text)

    # The offered backends' own fields (Backend.page_fields) come right after "backend".
    field_order = ["name", "image", "launcher", "gpus", "max_gpus", "script", "script_file", "script_path", "project_file",
                   "entry_point", "args", "env", "backend",
                   "gpu_model", "time_limit_minutes", "group", "priority", "tags", "note"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        offered = [backend for backend in backends.enabled() if backend.offered()]
        for name in self.backend_fields:           # each offered backend adds its page_fields instead
            del self.fields[name]
        own = {}
        for backend in offered:
            own.update(backend.page_fields())
        self.fields.update(own)
        after = self.field_order.index("backend") + 1
        self.order_fields(self.field_order[:after] + list(own) + self.field_order[after:])
        scripts = visible_scripts(self.user).order_by("owner", "name").only("pk", "name", "owner")
        self.fields["script"].choices = [("", "—")] + [
            (s.pk, f"{s.name}{'' if s.owner_id else ' (example)'}") for s in scripts
        ]
        described = ((pk, script_description(content)) for pk, content in
                     visible_scripts(self.user).filter(owner__isnull=True).values_list("pk", "content"))
        self.fields["script"].widget.descriptions = {str(pk): text for pk, text in described if text}
        self.fields["image"].widget.descriptions = {
            str(pk): text for pk, text in self.fields["image"].queryset.values_list("pk", "description") if text}
        self.kept_script = None
        self.fields["backend"].choices = [(backend.name, backend.label) for backend in offered]
        self.fields["backend"].initial = settings.RINGMASTER_DEFAULT_BACKEND
        self._choose_fitting_image(offered)
        self.fields["gpus"].help_text = " ".join(note for note in (b.gpus_note() for b in offered) if note)
        self.fields["backend"].help_text = " ".join(note for note in (b.isolation_note() for b in offered) if note)
        self.fields["gpus"].initial = 2
        self.fields["launcher"].help_text = JobForm.base_fields["launcher"].help_text
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
        self._limit_gpus(offered, groups)

    def _limit_gpus(self, offered, groups):
        """The GPU field's max: what this backend holds, the quota and the site allow (and, in
        data-limits, for every backend and group: jobform.js follows the selects)."""
        limits = formhints.gpu_limits(self.user, offered, groups)
        attrs, self.gpus_limit = formhints.limit_attrs(
            limits, self._chosen("backend") or settings.RINGMASTER_DEFAULT_BACKEND, self._chosen("group"))
        self.fields["gpus"].widget.attrs.pop("max", None)
        self.fields["gpus"].widget.attrs.update(attrs)

    def _chosen(self, name):
        """The value of a select as the page will show it ("" for none)."""
        if name not in self.fields:
            return ""
        if self.is_bound:
            return self.data.get(self.add_prefix(name)) or ""
        return self.initial.get(name) or self.fields[name].initial or ""

    def keep_upload(self, script):
        """Show the form again using `script`, stored from this submission's upload."""
        self.data = self.data.copy()
        self.data[self.add_prefix("uploaded_script")] = script.pk
        self.kept_script = script

    def clean_uploaded_script(self):
        pk = self.cleaned_data.get("uploaded_script")
        if pk is None:
            return None
        self.kept_script = Script.objects.filter(owner=self.user, pk=pk).only("pk", "name").first()
        if self.kept_script is None:
            raise forms.ValidationError(GONE)
        self.check_source("uploaded_script", projects.script_report(self.kept_script.name, self.kept_script.content))
        return self.kept_script

    def clean_parent(self):
        """The job this one reruns: one the user can see, or a clear error (never someone else's)."""
        pk = self.cleaned_data.get("parent")
        if pk is None:
            return None
        parent = visible_jobs(self.user).filter(pk=pk).first()
        if parent is None:
            raise forms.ValidationError(NOT_YOURS)
        return parent

    def job_fields(self):
        fields = super().job_fields()
        fields["parent"] = self.cleaned_data.get("parent")
        kept = self.cleaned_data.get("uploaded_script")
        if kept is not None:                 # a new file, if any, replaces it (services.submit)
            fields["script"], fields["script_path"] = kept, ""
        return fields

    @staticmethod
    def initial_from(job, data):
        """The form's initial values to rerun `job` (clone and edit); `data`: its API-shaped
        settings (services.resubmit_data)."""
        initial = {**data, "args": shlex.join(data.get("args") or []), "parent": job.pk, "priority": job.priority,
                   "env": "\n".join(f"{name}={value}" for name, value in (data.get("env") or {}).items()),
                   "tags": ", ".join(data.get("tags") or []),
                   "restart_on_exit_codes": ", ".join(map(str, data.get("restart_on_exit_codes") or []))}
        return initial

    def clean_image(self):
        return ImageField().clean(self.cleaned_data["image"])

    def _choose_fitting_image(self, offered):
        """The form opens on an image that runs on the backend it opens on."""
        default = next((b for b in offered if b.name == self.fields["backend"].initial), None)
        if default is not None:
            fitting = next((i for i in self.fields["image"].queryset if default.image_problem(i) is None), None)
            if fitting is not None:
                self.fields["image"].initial = fitting.pk

    def _has_upload(self):
        return bool(self.files.get("script_file")) or bool(self.cleaned_data.get("uploaded_script"))

    def clean_project_file(self):
        upload = self.cleaned_data.get("project_file")
        if not upload:
            return None
        upload_form = ProjectUploadForm(files={"file": upload})
        if not upload_form.is_valid():
            raise forms.ValidationError(upload_form.errors["file"])
        try:
            return projects.store(self.user, upload_form.cleaned_data["file"])
        except projects.BadProject as exc:
            raise forms.ValidationError(str(exc))

    def clean(self):
        if self.cleaned_data.get("project_file"):
            self.cleaned_data["project"] = self.cleaned_data["project_file"]
        return super().clean()

    def clean_script_file(self):
        upload = self.cleaned_data.get("script_file")
        if not upload:
            return None
        upload_form = ScriptUploadForm(files={"file": upload})
        if not upload_form.is_valid():
            raise forms.ValidationError(upload_form.errors["file"])
        script = upload_form.cleaned_data["file"]
        self.check_source("script_file", projects.script_report(script["name"], script["content"]))
        return script
