from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "project.orders"
    label = "orders"
    verbose_name = "Orders (demo)"
    default_auto_field = "django.db.models.BigAutoField"
