from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy_app"
    verbose_name = "Tenancy"
