from django.contrib import admin

from jobs.backends.admin_forms import report_checks
from jobs.backends.kubernetes import clusters
from jobs.backends.kubernetes.forms import ClusterForm, QueueMappingForm
from jobs.backends.kubernetes.models import Cluster, QueueMapping


class QueueMappingInline(admin.TabularInline):
    """Kueue queues of groups and users on the cluster (a user's own wins over their group's)."""
    model = QueueMapping
    form = QueueMappingForm
    fields = ["group", "user", "queue"]
    raw_id_fields = ["user"]
    extra = 0
    verbose_name = "Kueue queue of a group or user"
    verbose_name_plural = "Kueue queues of groups and users (in place of the cluster's Kueue queue)"


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterForm
    inlines = [QueueMappingInline]
    readonly_fields = ["kueue_found", "kueue_detail"]
    list_display = ["name", "connection", "namespace", "gpus_per_node", "gpu_limit", "kueue_queue", "kueue_found",
                    "enabled"]
    list_filter = ["enabled", "connection"]
    search_fields = ["name", "namespace"]
    actions = ["check_now"]

    @admin.action(description="Check now (list MPIJobs on the cluster)")
    def check_now(self, request, queryset):
        report_checks(self, request, queryset, clusters.check, ("ok", "failed"))
