from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"

    def ready(self):
        from django.db import transaction
        from django.db.models.signals import post_delete, post_save

        from tenancy_app.audit import track_changes
        from tenancy_app.versioning import track_configuration

        from .models import ModelConfig, Quota

        track_configuration(ModelConfig, Quota)
        track_changes(ModelConfig, Quota)

        def quota_changed(sender, instance, **kwargs):
            # A raised (or removed) limit resumes the Sessions parked for it, once committed.
            from .runtime import brain

            transaction.on_commit(lambda: brain.resume_quota_parked(instance.tenant_id))

        post_save.connect(quota_changed, sender=Quota, dispatch_uid="quota-resumes-parked", weak=False)
        post_delete.connect(
            quota_changed, sender=Quota, dispatch_uid="quota-resumes-parked-delete", weak=False
        )
