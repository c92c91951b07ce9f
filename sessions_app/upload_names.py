"""The name each uploaded file was sent with.

Django keeps only the last part of an uploaded file's name and then cuts it to 255 characters;
the upload API answers with the name the file was kept under and, when that is not the name
given, says so (`name_changed`, `requested_name`). Installed first in FILE_UPLOAD_HANDLERS, so
it sees every multipart body however it comes to be parsed (DRF's `request.data`, or the CSRF
check reading `request.POST` before the view runs).
"""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler

_ATTRIBUTE = "xagent_requested_upload_names"


class RequestedUploadNames(FileUploadHandler):
    """Notes each file part's name as sent; passes every byte on to the next handler untouched."""

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        names = getattr(self.request, _ATTRIBUTE, None)
        if names is None:
            names = {}
            setattr(self.request, _ATTRIBUTE, names)
        names.setdefault(field_name, file_name)

    def receive_data_chunk(self, raw_data, start):
        return raw_data

    def file_complete(self, file_size):
        return None


def requested_upload_name(request, field_name: str, fallback: str) -> str:
    """The name the `field_name` part was sent with (a Django or DRF request), else `fallback`."""
    django_request = getattr(request, "_request", request)
    return getattr(django_request, _ATTRIBUTE, {}).get(field_name) or fallback
