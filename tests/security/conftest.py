"""Admin clients for the security tests: a tenant owner (staff, not trusted with the host) and an
operator (a superuser)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


@pytest.fixture
def owner_a_admin(owner_a):
    client = Client()
    client.force_login(owner_a)
    return client


@pytest.fixture
def operator_admin(db):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root_op", "root@example.com", "pw"))
    return client
