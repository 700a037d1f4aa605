from django.db import models


class Order(models.Model):
    """A demo order: closed by its `order.close` timeout unless it is paid first."""

    class Status(models.TextChoices):
        OPEN = "open", "open"
        PAID = "paid", "paid"
        CLOSED = "closed", "closed"

    created = models.DateTimeField(auto_now_add=True)
    paid = models.BooleanField(default=False)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)

    class Meta:
        ordering = ("-id",)

    def __str__(self):
        return f"order #{self.pk} ({self.status})"
