"""`manage.py mcp_server add|refresh`: provisioning MCP servers from scripts (CONTRACT).

The same owner operations as the admin action (`tools_app.mcp.sync`). `refresh` prints the
model-facing names of the tools found on standard output, one per line; the summary goes to
standard error so scripts can read the names alone.
"""

from django.core.management.base import BaseCommand, CommandError

from tenancy_app.models import Tenant
from tools_app.mcp.client import MCPError
from tools_app.mcp.stdio import python_module_launch
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer


def parse_pairs(pairs: list[str] | None, what: str) -> dict[str, str]:
    """`["K=V", ...]` -> `{"K": "V"}`; the value may itself contain `=`."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"Invalid {what} {pair!r}: use NAME=value.")
        result[key.strip()] = value
    return result


class Command(BaseCommand):
    help = "Add an MCP server to a tenant, or refresh the tools of one (prints the tools found)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="{add,refresh}")

        add = actions.add_parser(
            "add",
            help="add a server (stdio command or Streamable HTTP URL), then refresh its tools",
            description=(
                "Add an MCP server. Give an argument starting with '-' as --arg=-m "
                "(manage.py mcp_server add demo --tenant acme --command python3 --arg=-m --arg pkg.server). "
                "A stdio server runs in the process sandbox with its own directory; --network and "
                "--read-path widen that sandbox. "
                "Values of --env and --header may reference tenant secrets as {{secret:NAME}}."
            ),
        )
        add.add_argument("name")
        add.add_argument("--tenant", required=True, help="tenant slug")
        where = add.add_mutually_exclusive_group(required=True)
        where.add_argument(
            "--command", dest="server_command", metavar="CMD", help="stdio: the executable to run"
        )
        where.add_argument("--url", help="Streamable HTTP: the endpoint URL")
        where.add_argument(
            "--python-module",
            metavar="MODULE",
            help="stdio: run a Python module of this project in the sandbox (sets the command, "
            "PYTHONPATH and read-only paths), e.g. tools_app.mcp.example_server",
        )
        add.add_argument("--arg", action="append", default=[], help="stdio: one argument (repeatable)")
        add.add_argument("--env", action="append", default=[], help="stdio: K=V (repeatable)")
        add.add_argument(
            "--network", action="store_true", help="stdio: let the sandboxed server use the network"
        )
        add.add_argument(
            "--read-path",
            action="append",
            default=[],
            metavar="PATH",
            help="stdio: a host path the sandboxed server may read (repeatable)",
        )
        add.add_argument("--header", action="append", default=[], help="HTTP: K=V (repeatable)")
        add.add_argument("--timeout", type=int, default=30, help="seconds per operation (default 30)")
        add.add_argument(
            "--no-refresh", action="store_true", help="only record the server; do not connect to it yet"
        )

        refresh = actions.add_parser("refresh", help="connect to a server and refresh its tools")
        refresh.add_argument("name")
        refresh.add_argument("--tenant", required=True, help="tenant slug")

    def handle(self, *args, action, name, tenant, **options):
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        if action == "add":
            server = self._add(tenant_obj, name, options)
            self.stderr.write(
                f"Added MCP server {server.name} ({server.transport}) to tenant {tenant_obj.slug}."
            )
            if options["no_refresh"]:
                return
        else:
            server = MCPServer.objects.for_tenant(tenant_obj).filter(name=name).first()
            if server is None:
                raise CommandError(f"No MCP server {name} in tenant {tenant_obj.slug}.")
        self._refresh(server)

    def _add(self, tenant, name, options) -> MCPServer:
        command, args = options["server_command"], options["arg"]
        env, read_paths = parse_pairs(options["env"], "--env"), options["read_path"]
        stdio = command is not None or options["python_module"] is not None
        if not stdio and (args or env or options["network"] or read_paths):
            raise CommandError(
                "--arg and --env belong to a stdio server (--command or --python-module), as do "
                "--network and --read-path; not to --url."
            )
        if stdio and options["header"]:
            raise CommandError("--header belongs to a Streamable HTTP server (--url), not to a stdio one.")
        try:
            if options["python_module"] is not None:
                launch = python_module_launch(options["python_module"], args)
                command, args = launch.command, launch.args
                env, read_paths = launch.env | env, [*launch.read_paths, *read_paths]
            return add_server(
                tenant,
                name,
                MCPServer.Transport.STDIO if stdio else MCPServer.Transport.STREAMABLE_HTTP,
                command=command or "",
                args=args,
                env=env,
                url=options["url"] or "",
                headers=parse_pairs(options["header"], "--header"),
                timeout_seconds=options["timeout"],
                network_enabled=options["network"],
                sandbox_read_paths=read_paths,
                by_operator=True,  # whoever runs manage.py is trusted with the host
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def _refresh(self, server: MCPServer) -> None:
        try:
            result = refresh_server(server)
        except MCPError as exc:
            raise CommandError(f"Refreshing the tools of MCP server {server.name} failed: {exc}") from None
        for tool in result.tools:
            self.stdout.write(tool.name)
        self.stderr.write(
            f"{len(result.tools)} tools from {server.name}: {len(result.added)} added, "
            f"{len(result.updated)} updated, {len(result.removed)} no longer listed."
        )
