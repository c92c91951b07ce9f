"""The OAuth callback route of MCP servers: where authorization servers send an admin's
browser back after "Connect" (`/mcp/oauth/callback/`). Thin: `mcp.oauth` owns the rules."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from .models import MCPOAuthAttempt

# The browser waits this long for the token exchange and the tool refresh to finish, so the
# admin lands on a page that says how it went; past it the flow finishes in the background.
OUTCOME_WAIT_SECONDS = 30


@require_GET
def oauth_callback(request):
    # Here, not at import: the URLconf (loaded by every web process and by a worker's start-up
    # checks) must not pull in the MCP SDK's OAuth client, about a second of CPU.
    from .mcp.oauth import CallbackRefused, access_attempt, do_receive_code, wait_for_outcome

    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if any("\x00" in request.GET.get(name, "") for name in ("state", "code", "iss", "error")):
        # PostgreSQL cannot compare or store text holding NUL: refuse it before the database does.
        message = "The authorization server's answer is malformed. Start again with Connect."
        return render(request, "tools_app/oauth_callback.html", {"message": message}, status=400)
    try:
        attempt = access_attempt(request.user, request.GET.get("state", ""))
        do_receive_code(
            attempt,
            code=request.GET.get("code", ""),
            iss=request.GET.get("iss", ""),
            error=request.GET.get("error", ""),
        )
    except CallbackRefused as exc:
        return render(request, "tools_app/oauth_callback.html", {"message": str(exc)}, status=exc.status)
    attempt = wait_for_outcome(attempt, OUTCOME_WAIT_SECONDS)
    if attempt.status == MCPOAuthAttempt.Status.CONNECTED:
        messages.success(request, attempt.outcome or f"{attempt.server.name}: connected.")
    elif attempt.status == MCPOAuthAttempt.Status.FAILED:
        messages.error(request, attempt.outcome)
    else:
        messages.info(request, f"{attempt.server.name}: still connecting; reload this page in a moment.")
    return redirect("admin:tools_app_mcpserver_change", attempt.server_id)
