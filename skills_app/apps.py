from django.apps import AppConfig


class SkillsConfig(AppConfig):
    name = "skills_app"
    verbose_name = "Skills"

    def ready(self):
        from tenancy_app.audit import track_changes
        from tenancy_app.versioning import track_configuration

        from .models import Skill

        # A running slice caches the Skills it offers and the bodies it loaded: a change (a new
        # version, enabled off) applies from the next request it assembles.
        track_configuration(Skill)
        track_changes(Skill)
