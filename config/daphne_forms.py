"""Leave request bodies to Django when daphne serves us.

Twisted (under daphne) parses every POST multipart or urlencoded body itself, into memory, before
the request reaches Django — and answers a malformed multipart body with a bare 400 and no body,
outside the CONTRACT error shape. Twisted's `Request(parsePOSTFormSubmission=False)` turns that
off; daphne builds its requests without passing it, so it is set on each new request here.
Django then parses the body (spooled to disk when large) and a malformed one is our JSON 400.
"""

from __future__ import annotations


def leave_form_bodies_to_django() -> bool:
    """Idempotent; False when daphne is not installed (another ASGI server parses nothing)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:
        return False
    if getattr(WebRequest, "_xagent_forms_left_to_django", False):
        return True
    original_init = WebRequest.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    WebRequest.__init__ = __init__
    WebRequest._xagent_forms_left_to_django = True
    return True
