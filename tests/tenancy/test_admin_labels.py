"""Admin forms spell acronyms as people do: "URL", "Base URL", "API key" (not Django's
capitalised field names "Url", "Base url", "Api key")."""

import re

import pytest
from django.test import Client

PAGES = {
    "/admin/sessions_app/modelconfig/add/": ["Base URL", "API key"],
    "/admin/tools_app/mcpserver/add/": ["URL", "OAuth client metadata URL", "OAuth client ID"],
}


@pytest.mark.parametrize("url, labels", PAGES.items())
def test_labels_spell_acronyms(owner_a, url, labels):
    client = Client()
    client.force_login(owner_a)

    page = client.get(url)

    assert page.status_code == 200
    shown = re.findall(r"<label[^>]*>([^<]+)</label>", page.content.decode())
    shown = [label.strip().rstrip(":") for label in shown]
    for label in labels:
        assert label in shown, shown
    assert not [label for label in shown if re.search(r"\b(Url|url|Api)\b", label)], shown
