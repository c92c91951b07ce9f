"""Admin → Quotas: a tenant admin sets limits for their own tenant and its members only; the form
refuses a limit-less quota and a user from outside the tenant; another tenant's quotas are not
listed, and their change page is a 404-like redirect, never a form."""

import pytest
from django.test import Client

from sessions_app.models import Quota

pytestmark = pytest.mark.django_db

URL = "/admin/sessions_app/quota/"


@pytest.fixture
def tenant_admin(owner_a):
    client = Client()
    client.force_login(owner_a)
    return client


def test_a_tenant_admin_sets_a_members_monthly_cost_limit(tenant_admin, tenant_a, member_a):
    response = tenant_admin.post(
        f"{URL}add/", {"tenant": tenant_a.pk, "user": member_a.pk, "period": "month", "max_cost": "12.50"}
    )
    assert response.status_code == 302, response.content[:2000]
    quota = Quota.objects.get()
    assert (quota.tenant, quota.user, quota.period, str(quota.max_cost)) == (
        tenant_a,
        member_a,
        "month",
        "12.5000",
    )
    listed = tenant_admin.get(URL)
    assert listed.status_code == 200 and b"within the limit" in listed.content


@pytest.mark.parametrize(
    "data, message",
    [
        ({"period": "day"}, b"Set a token limit, a cost limit, or both."),
        ({"period": "day", "max_cost": "-1"}, b"must not be negative"),
    ],
)
def test_the_form_refuses_what_cannot_be_a_limit(tenant_admin, tenant_a, data, message):
    response = tenant_admin.post(f"{URL}add/", {"tenant": tenant_a.pk, **data})
    assert response.status_code == 200 and message in response.content
    assert not Quota.objects.exists()


def test_another_tenants_people_and_quotas_are_out_of_reach(tenant_admin, tenant_a, tenant_b, outsider_b):
    response = tenant_admin.post(
        f"{URL}add/", {"tenant": tenant_a.pk, "user": outsider_b.pk, "period": "day", "max_tokens": 5}
    )
    assert response.status_code == 200 and not Quota.objects.exists()  # not offered: a form error
    theirs = Quota.objects.create(tenant=tenant_b, period="day", max_tokens=10)
    assert theirs not in tenant_admin.get(URL).context["cl"].result_list
    assert tenant_admin.get(f"{URL}{theirs.pk}/change/").status_code in (302, 404)
