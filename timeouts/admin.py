"""A read-only admin for TimeoutTask (the full operators' admin is tracked separately)."""

from django.contrib import admin

from .models import TimeoutTask


@admin.register(TimeoutTask)
class TimeoutTaskAdmin(admin.ModelAdmin):
    list_display = ("job_id", "biz_type", "biz_id", "status", "action_time", "attempts")
    list_filter = ("status",)
    search_fields = ("=biz_id",)
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
