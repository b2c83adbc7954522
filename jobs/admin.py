from django.contrib import admin

from .models import Image, Job, JobEvent, Script


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "python", "container_image", "description"]
    list_filter = ["enabled"]
    list_editable = ["enabled"]
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


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Read-only: a job's state changes only through the state machine (cancel from its page)."""

    list_display = ["id", "name", "owner", "image", "gpus", "backend", "state", "created_at", "gpu_seconds"]
    list_filter = ["state", "backend", "image"]
    search_fields = ["name", "owner__username"]
    inlines = [JobEventInline]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False
