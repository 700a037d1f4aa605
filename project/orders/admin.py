from django.contrib import admin, messages
from django.db import transaction

import timeouts

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "created", "paid", "status")
    list_filter = ("status", "paid")
    actions = ("mark_paid",)

    @admin.action(description="Mark as paid (cancels the order's timeout)")
    def mark_paid(self, request, queryset):
        cancelled = 0
        for order in queryset.filter(status=Order.Status.OPEN):
            with transaction.atomic():
                Order.objects.filter(pk=order.pk).update(paid=True, status=Order.Status.PAID)
                # True: the order's timeout had not started, and now never will.
                cancelled += timeouts.cancel("order.close", order.pk)
        self.message_user(request, f"Marked as paid; {cancelled} timeout(s) cancelled.", messages.SUCCESS)
