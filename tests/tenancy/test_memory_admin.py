"""Memories in admin: a tenant admin reads (and may delete) the memories of their tenant's
users, never another tenant's; nobody adds or edits one there (only memory_save writes)."""

from __future__ import annotations

from django.test import Client

from sessions_app.models import Memory
from sessions_app.runtime import memory

URL = "/admin/sessions_app/memory/"


def _save(tenant, user, text):
    return memory.save(tenant_id=tenant.pk, user_id=user.pk, text=text, kind="topic")[0]


def test_a_tenant_admin_sees_only_their_tenants_memories(owner_a, member_a, outsider_b, tenant_a, tenant_b):
    mine = _save(tenant_a, member_a, "Alpha member works on billing")
    theirs = _save(tenant_b, outsider_b, "Bravo roadmap is secret")
    client = Client()
    client.force_login(owner_a)

    page = client.get(URL)
    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [mine]
    assert "Bravo roadmap" not in page.content.decode()
    assert client.get(f"{URL}?q=Bravo").context["cl"].result_list.count() == 0
    assert client.get(f"{URL}{theirs.pk}/change/").status_code in (302, 404)
    assert client.post(f"{URL}{theirs.pk}/delete/", {"post": "yes"}).status_code in (302, 404)
    assert Memory.objects.filter(pk=theirs.pk).exists()

    # Read-only: no add, no edit; deleting one of their own tenant's is allowed.
    assert client.get(f"{URL}add/").status_code == 403
    assert client.post(f"{URL}{mine.pk}/change/", {"text": "edited", "kind": "topic"}).status_code == 403
    assert client.post(f"{URL}{mine.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Memory.objects.filter(pk=mine.pk).exists()
