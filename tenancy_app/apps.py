from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy_app"
    verbose_name = "Tenancy"

    def ready(self):
        from . import (
            audit,
            schema,  # noqa: F401  (registers the OpenAPI auth extension)
        )
        from .revocation import connect_signals

        connect_signals()
        audit.connect_signals()
