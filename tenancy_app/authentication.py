"""`Authorization: Bearer <api key>` for the REST API."""

from rest_framework import authentication, exceptions

from .actions import authenticate_api_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        token = token.strip()
        if not token:
            raise exceptions.AuthenticationFailed("The Authorization header has no API key after 'Bearer'.")
        found = authenticate_api_key(token)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        key, membership = found
        # The key's tenant is fixed: a key never acts for another tenant of the same user.
        request._request.tenant_membership = membership
        request._request.audit_api_key = key  # the audit log names the key an action used
        return key.user, key

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'
