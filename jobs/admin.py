from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.template.response import TemplateResponse
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from jobs import backends
from jobs.domain import services
from jobs.web.forms import MAX_PRIORITY
from jobs.models import (
    GitAllowedNetwork, Image, Job, JobEvent, NotifyAllowedNetwork, Quota, Script, SsoGroup, State, UserSettings,
)


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "extra_packages", "python", "container_image", "max_processes", "memory_mib",
                    "description"]
    list_filter = ["enabled", "extra_packages"]
    list_editable = ["enabled", "extra_packages"]
    search_fields = ["name", "description", "container_image"]


@admin.register(Script)
class ScriptAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "size", "sha256", "created_at"]
    search_fields = ["name", "sha256", "owner__username"]
    readonly_fields = ["sha256", "size", "created_at"]


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["ts", "state", "message"]


class PriorityForm(forms.Form):
    priority = forms.IntegerField(min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY,
                                  help_text="Higher runs first; the default is 0.")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Read-only: a job's state changes only through the state machine. Queued jobs can be held,
    released, reprioritised or cancelled with the actions; each is recorded in the job's events
    and in the admin history (who, when)."""

    list_display = ["id", "name", "owner", "charged_group", "image", "gpus", "backend", "state", "priority",
                    "held", "created_at", "gpu_seconds", "reason"]
    list_filter = ["state", "held", "backend", "charged_group", "image"]
    search_fields = ["name", "owner__username", "charged_group__name"]
    list_select_related = ["owner", "charged_group", "image"]
    inlines = [JobEventInline]
    actions = ["hold_jobs", "release_jobs", "set_priority", "cancel_jobs"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False

    def has_schedule_permission(self, request):
        """Hold, release, reprioritise, cancel: staff who may change jobs."""
        return request.user.is_staff and request.user.has_perm("jobs.change_job")

    def _each_queued(self, request, queryset, change, verb):
        done, skipped = 0, []
        for job in queryset:
            try:
                change(job)
            except (services.NotQueued, services.CannotCancel) as exc:
                skipped.append(str(exc))
                continue
            self.log_change(request, job, f"{verb} by {request.user.get_username()}")
            done += 1
        if done:
            self.message_user(request, f"{verb.capitalize()}: {done} job{'s' if done != 1 else ''}.", messages.SUCCESS)
        for problem in skipped:
            self.message_user(request, f"Skipped: {problem}.", messages.WARNING)

    @admin.action(description="Hold the selected queued jobs", permissions=["schedule"])
    def hold_jobs(self, request, queryset):
        self._each_queued(request, queryset, lambda job: services.hold(job, by=request.user), "held")

    @admin.action(description="Release the selected held jobs", permissions=["schedule"])
    def release_jobs(self, request, queryset):
        self._each_queued(request, queryset, lambda job: services.release(job, by=request.user), "released")

    @admin.action(description="Cancel the selected jobs", permissions=["schedule"])
    def cancel_jobs(self, request, queryset):
        self._each_queued(request, queryset, lambda job: services.cancel(job, by=request.user), "cancelled")

    @admin.action(description="Set the priority of the selected queued jobs", permissions=["schedule"])
    def set_priority(self, request, queryset):
        form = PriorityForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            priority = form.cleaned_data["priority"]
            self._each_queued(request, queryset, lambda job: services.set_priority(job, priority, by=request.user),
                              f"priority set to {priority}")
            return None
        return TemplateResponse(request, "admin/jobs/job/set_priority.html", {
            **self.admin_site.each_context(request),
            "title": "Set the priority of queued jobs",
            "opts": self.model._meta,
            "form": form,
            "jobs": queryset.filter(state=State.QUEUED),
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "action": "set_priority",
        })


def backend_choices():
    return [("", "all backends")] + [(b.name, b.label) for b in backends.enabled()]


class QuotaForm(forms.ModelForm):
    """The backend is one of the enabled backends, or empty: all of them together."""

    backend = forms.TypedChoiceField(choices=backend_choices, required=False, empty_value="")

    class Meta:
        model = Quota
        fields = "__all__"


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Quotas per user or group, optionally per backend. Every change is kept in the row's
    History (who changed what, when)."""

    form = QuotaForm

    list_display = ["__str__", "gpus", "jobs", "gpus_per_job", "gpu_hours", "window_days", "updated_at"]
    list_filter = ["backend", ("group", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["user__username", "group__name"]
    autocomplete_fields = ["user", "group"]
    list_select_related = ["user", "group"]
    fieldsets = [
        (None, {"fields": ["user", "group", "backend"],
                "description": "One of user or group. Empty limits: the site default for a user's "
                               "all-backends row, otherwise no limit of that kind."}),
        ("Limits", {"fields": ["gpus", "jobs", "gpus_per_job", "gpu_hours", "window_days"]}),
    ]


class QuotaInline(admin.TabularInline):
    model = Quota
    form = QuotaForm
    extra = 0
    fields = ["backend", "gpus", "jobs", "gpus_per_job", "gpu_hours", "window_days"]


class UserSettingsInline(admin.StackedInline):
    model = UserSettings
    can_delete = False
    extra = 0
    max_num = 1


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)
if admin.site.is_registered(Group):
    admin.site.unregister(Group)


@admin.register(User)
class RingmasterUserAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, QuotaInline, UserSettingsInline]


@admin.register(Group)
class RingmasterGroupAdmin(GroupAdmin):
    """Groups, with their quotas; those the directory keeps (jobs.domain.directory) say so."""

    inlines = [*GroupAdmin.inlines, QuotaInline]
    list_display = ["name", "kept_by_directory"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("sso")

    @admin.display(boolean=True, description="kept by single sign-on")
    def kept_by_directory(self, group):
        return hasattr(group, "sso")


@admin.register(SsoGroup)
class SsoGroupAdmin(admin.ModelAdmin):
    """The groups whose members the directory's groups claim sets at each sign-on. Deleting a
    row hands its group back to the admin: members stay, and sign-ons no longer change them
    (until the claim names it again)."""

    list_display = ["group", "since"]
    search_fields = ["group__name"]
    readonly_fields = ["group", "since"]

    def has_add_permission(self, request):
        return False


@admin.register(NotifyAllowedNetwork)
class NotifyAllowedNetworkAdmin(admin.ModelAdmin):
    """Networks that notification targets may point at although they are private, loopback,
    link-local or the portal's own (jobs.domain.destinations); beside the setting
    RINGMASTER_NOTIFY_ALLOWED_NETWORKS. A change holds at once, in web and workers."""

    list_display = ["network", "note"]
    search_fields = ["network", "note"]


@admin.register(GitAllowedNetwork)
class GitAllowedNetworkAdmin(admin.ModelAdmin):
    """Networks that git repositories may be fetched from although they are private, loopback,
    link-local or the portal's own (jobs.domain.destinations); beside the setting
    RINGMASTER_GIT_ALLOWED_NETWORKS. A list apart from notifications': a fetch reads from there."""

    list_display = ["network", "note"]
    search_fields = ["network", "note"]
