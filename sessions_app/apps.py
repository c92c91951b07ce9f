from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"

    def ready(self):
        from tenancy_app.versioning import track_configuration

        from .models import ModelConfig

        track_configuration(ModelConfig)
