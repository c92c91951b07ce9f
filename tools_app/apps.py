from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"
