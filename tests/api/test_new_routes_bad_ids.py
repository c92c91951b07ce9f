"""Ids no row can have, on the routes Skills and Memory added: a CONTRACT 404, never a 500
(an id past the 64-bit range would overflow the database's integer)."""

import pytest

from tests.runtime.helpers import new_session
from tests.tenancy.isolation import assert_error_shape

HUGE = "99999999999999999999999"


@pytest.mark.parametrize(
    "route",
    [
        "model-calls/{huge}/",
        "input-requests/{huge}/",
        "input-requests/{huge}/answer/",
        "memories/{huge}/",
        "skills/{huge}/",
    ],
)
def test_an_id_past_any_integer_is_a_404(api_owner_a, tenant_a, owner_a, route):
    session = new_session(tenant_a, owner_a)
    prefix = f"/api/v1/sessions/{session.pk}/" if route.startswith(("model-calls", "input-")) else "/api/v1/"
    url = prefix + route.format(huge=HUGE)
    if url.endswith("answer/"):
        response = api_owner_a.post(url, {"action": "decline"}, format="json")
    else:
        response = api_owner_a.get(url)
    assert_error_shape(response, 404, "not_found")
