"""OAuth 2.1 per MCP server (issue #14): the auth mode and client settings of a server, its
encrypted grant (tokens, registered client) and the admin's Connect attempts keyed by `state`."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy_app", "0003_tenant_auto_resume_after_recovery"),
        ("tools_app", "0005_mcp_stdio_sandbox"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="mcpserver",
            name="auth_mode",
            field=models.CharField(
                choices=[
                    ("none", "None"),
                    ("headers", "Static headers (an Authorization header in Headers)"),
                    ("oauth", "OAuth: authorization code + PKCE (an admin connects it)"),
                    ("client_credentials", "OAuth: client credentials (machine to machine)"),
                ],
                default="none",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_client_id",
            field=models.CharField(blank=True, help_text="Pre-registered client ID.", max_length=300),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_client_metadata_url",
            field=models.URLField(
                blank=True,
                help_text="Client ID metadata document: an https URL used as the client_id.",
                max_length=500,
            ),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_client_registration",
            field=models.CharField(
                choices=[
                    ("dynamic", "Dynamic client registration"),
                    ("metadata_document", "Client ID metadata document (URL)"),
                    ("pre_registered", "Pre-registered client ID (and secret)"),
                ],
                default="dynamic",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_client_secret_encrypted",
            field=models.TextField(blank=True, editable=False),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_issuer",
            field=models.URLField(
                blank=True,
                help_text="Client credentials: the authorization server the client secret belongs to (recommended: the secret is then sent only there).",
                max_length=500,
            ),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_scopes",
            field=models.CharField(
                blank=True,
                help_text="Space-separated; used when the server names none (its challenge or metadata wins).",
                max_length=500,
            ),
        ),
        migrations.AddField(
            model_name="mcpserver",
            name="oauth_token_endpoint_auth_method",
            field=models.CharField(
                choices=[
                    ("client_secret_basic", "client_secret_basic"),
                    ("client_secret_post", "client_secret_post"),
                    ("none", "none (public client)"),
                ],
                default="client_secret_basic",
                max_length=20,
            ),
        ),
        migrations.CreateModel(
            name="MCPOAuthAttempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=200, unique=True)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("waiting", "Waiting for the callback"),
                            ("code_received", "Code received"),
                            ("connected", "Connected"),
                            ("failed", "Failed"),
                        ],
                        default="waiting",
                        max_length=15,
                    ),
                ),
                ("code_encrypted", models.TextField(blank=True)),
                ("iss", models.CharField(blank=True, max_length=500)),
                (
                    "outcome",
                    models.CharField(blank=True, help_text="How it went, in a sentence.", max_length=500),
                ),
                ("expires_at", models.DateTimeField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "server",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tools_app.mcpserver",
                    ),
                ),
                (
                    "started_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenancy_app.tenant"
                    ),
                ),
            ],
            options={
                "verbose_name": "MCP OAuth attempt",
            },
        ),
        migrations.CreateModel(
            name="MCPOAuthGrant",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tokens_encrypted", models.TextField(blank=True)),
                ("client_info_encrypted", models.TextField(blank=True)),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
                ("has_refresh_token", models.BooleanField(default=False)),
                ("consent_version", models.PositiveIntegerField(default=0)),
                ("token_version", models.PositiveIntegerField(default=0)),
                ("connected_at", models.DateTimeField(blank=True, null=True)),
                ("lost_reason", models.CharField(blank=True, max_length=300)),
                ("refresh_lease_until", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "connected_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "server",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="oauth_grant",
                        to="tools_app.mcpserver",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenancy_app.tenant"
                    ),
                ),
            ],
            options={
                "verbose_name": "MCP OAuth grant",
            },
        ),
    ]
