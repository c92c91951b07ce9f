from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"

    def ready(self):
        from django.db.models.signals import post_migrate

        post_migrate.connect(_sync_native_tools, sender=self)


def _sync_native_tools(sender, **kwargs):
    """Keep the global Tool rows in step with the code registry after every migrate/flush."""
    from .catalog import sync_native_tools

    sync_native_tools()
