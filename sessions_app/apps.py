from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
