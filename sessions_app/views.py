from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render


@login_required
def home(request):
    """The browser workspace. Sessions arrive with the runtime; for now: who, where, and links."""
    return render(request, "workspace/home.html", {"embedded": settings.EMBEDDED})
