"""A real OpenID Connect provider on loopback for the sign-in tests: panva's `oidc-provider`
(Node.js, tests/support/oidc_provider/), the certified implementation many products test
against. `running_provider()` starts it on a free port and yields its issuer; `sign_in_at()`
plays the browser at the provider (its development login page) and returns the callback URL
the provider redirects to, with `code` and `state`."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urljoin

import requests

PROVIDER_DIR = Path(__file__).with_name("oidc_provider")
CLIENT_ID = "xagent-workspace"
CLIENT_SECRET = "test-client-secret-0123456789"


def node_ready() -> str:
    """Why the provider cannot run here, or "" (node and its npm packages are installed)."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        return f"run `npm ci --prefix {PROVIDER_DIR}` (make install does)"
    return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_provider(redirect_uri: str, accounts: dict, *, port: int | None = None):
    port = port or _free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "CLIENT_ID": CLIENT_ID,
        "CLIENT_SECRET": CLIENT_SECRET,
        "REDIRECT_URI": redirect_uri,
        "OIDC_ACCOUNTS": json.dumps(accounts),
        "NODE_NO_WARNINGS": "1",
    }
    proc = subprocess.Popen(
        ["node", "server.mjs"],
        cwd=PROVIDER_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    issuer = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "the OIDC provider did not start"
            time.sleep(0.1)
        yield issuer
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def sign_in_at(authorization_url: str, login: str, redirect_prefix: str) -> str:
    """Follow the provider's pages as a browser would, sign in as `login` on its development login
    form, and return the URL it sends the browser back to (starting with `redirect_prefix`)."""
    with requests.Session() as browser:
        url = authorization_url
        for _ in range(10):
            response = browser.get(url, allow_redirects=False, timeout=10)
            if response.status_code in (302, 303):
                url = urljoin(url, response.headers["location"])
                if url.startswith(redirect_prefix):
                    return url
                continue
            form = re.search(r'<form[^>]*action="([^"]+)"', response.text)
            assert response.status_code == 200 and form, response.text[:2000]
            action = urljoin(url, form.group(1))
            response = browser.post(
                action,
                data={"prompt": "login", "login": login, "password": "any"},
                allow_redirects=False,
                timeout=10,
            )
            assert response.status_code in (302, 303), response.text[:2000]
            url = urljoin(action, response.headers["location"])
            if url.startswith(redirect_prefix):
                return url
    raise AssertionError("the provider never sent the browser back")
