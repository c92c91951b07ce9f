"""`{% module_import_map "js/session" %}`: an import map for a folder of native ES modules.

In production the static files have content-hashed names (whitenoise's manifest storage) but a module's
`import … from "./timeline.js"` names the plain file. Django's rewriting of module imports
(`support_js_module_import_aggregation`) cannot hash modules that import each other in a cycle (the page's parts do: events apply to
panels that send events), so the page maps each plain URL to its served one instead: a deploy
pairs every module with its own version, never a stale one from a browser's cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from django import template
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.utils.safestring import mark_safe

register = template.Library()


@register.simple_tag
def module_import_map(folder: str) -> str:
    found = finders.find(folder)
    directory = Path(found) if isinstance(found, str) else None
    names = sorted(p.name for p in directory.glob("*.js")) if directory and directory.is_dir() else []
    prefix = settings.STATIC_URL if settings.STATIC_URL.endswith("/") else f"{settings.STATIC_URL}/"
    imports = {f"{prefix}{folder}/{name}": static(f"{folder}/{name}") for name in names}
    text = json.dumps({"imports": imports}, indent=1).replace("</", "<\\/")
    return mark_safe(f'<script type="importmap">{text}</script>')
