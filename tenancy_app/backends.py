"""Authentication backends: passwords (unless every tenant of the user turned them off) and the
session of a user who signed in through the OpenID Connect provider (tenancy_app/oidc.py)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend

from . import oidc


def _active_user(user_id):
    user = get_user_model()._default_manager.filter(pk=user_id).first()
    return user if user is not None and user.is_active else None


class PasswordBackend(ModelBackend):
    def user_can_authenticate(self, user):
        return super().user_can_authenticate(user) and oidc.password_sign_in_allowed(user)

    def get_user(self, user_id):
        # A session signed in with a password before its tenant turned passwords off lasts until
        # it ends; only new password sign-ins are refused.
        return _active_user(user_id)


class SingleSignOnBackend(ModelBackend):
    """The session of a user the provider vouched for (the callback view logs them in); it
    authenticates nobody by credentials."""

    def authenticate(self, request, **credentials):
        return None

    def get_user(self, user_id):
        return _active_user(user_id)
