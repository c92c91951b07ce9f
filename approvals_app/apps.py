from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals_app"
    verbose_name = "Approvals"

    def ready(self):
        from tenancy_app.audit import track_changes
        from tenancy_app.versioning import track_configuration

        from .policy_models import ApprovalPolicy, ApprovalRule

        track_configuration(ApprovalPolicy, ApprovalRule)
        track_changes(ApprovalPolicy, ApprovalRule)
