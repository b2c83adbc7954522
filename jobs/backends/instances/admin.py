from django.contrib import admin
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from jobs.backends.admin_forms import report_checks
from jobs.backends.instances import backend as instances
from jobs.backends.instances.backend import held, isolation_of
from jobs.backends.instances.forms import InstanceForm
from jobs.backends.instances.models import Instance
from runners import ssh


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    form = InstanceForm
    list_display = ["name", "host", "port", "user", "gpus", "slots_in_use", "gpus_seen", "labels", "enabled",
                    "healthy", "health_reason", "health_checked_at"]
    list_filter = ["enabled", "healthy"]
    search_fields = ["name", "host", "labels"]
    readonly_fields = ["healthy", "health_reason", "health_checked_at", "gpus_detected", "gpu_list",
                       "host_key_fingerprint", "job_isolation"]
    actions = ["check_health_now"]

    @admin.display(description="slots in use")
    def slots_in_use(self, obj):
        return held([obj.pk])[0][obj.pk]

    @admin.display(description="job isolation")
    def job_isolation(self, obj):
        return isolation_of(obj)

    @admin.display(description="GPUs seen")
    def gpus_seen(self, obj):
        return obj.gpus_seen()

    @admin.display(description="GPUs (last health check)")
    def gpu_list(self, obj):
        if not obj.gpu_inventory:
            return obj.gpus_seen()
        in_use = set(held([obj.pk])[1][obj.pk])
        return format_html_join(mark_safe("<br>"), "{}: {}, {} MiB{} <small>{}</small>", (
            (gpu["index"], gpu.get("name", "?"), gpu.get("memory_mib", "?"),
             " (in use)" if gpu["index"] in in_use else "", gpu.get("uuid", ""))
            for gpu in obj.gpu_inventory))

    @admin.display(description="host key")
    def host_key_fingerprint(self, obj):
        return ssh.host_key_fingerprint(obj.host_key) if obj.host_key else "not recorded yet"

    def has_delete_permission(self, request, obj=None):
        """An instance that jobs hold slots on stays until they end (one chosen among others stops
        the admin's delete action, as a protected object would)."""
        if obj is not None and held([obj.pk])[0][obj.pk]:
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Check health now (over SSH)")
    def check_health_now(self, request, queryset):
        report_checks(self, request, queryset, lambda instance: instances.check(instance, build=True),
                      ("healthy", "unhealthy"))
