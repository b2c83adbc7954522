from django.contrib import admin

from tests.modelbackend.models import Machine


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = ("name", "slots", "enabled", "checked_at", "checks")
    list_filter = ("enabled",)
    readonly_fields = ("checked_at", "checks")
