from django.apps import AppConfig


class SkillsConfig(AppConfig):
    name = "skills_app"
    verbose_name = "Skills"
