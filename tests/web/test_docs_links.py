"""README.md and docs/*.md work as written (issue #27, "Docs that work as written").

- Every Markdown link resolves: a relative target is a file of the repository (never outside it),
  and its `#anchor` is a heading of that file (GitHub's slugs); an absolute target is a public
  documentation site; nothing else (`file:`, `mailto:`, `/abs/path`, …).
- Every command in a fenced shell block runs from a fresh clone at the repository root: no bare
  `python`/`pip` (Django lives in `.venv` only), `.venv/bin/<tool>` exists, `manage.py <command>`
  exists and accepts the flags shown, `make <target>` is a Makefile target, `-m <module>` imports,
  and the repository files a command names exist.
- README.md stays a front door (at most ~250 lines), no table cell is a wall of text, and each
  `<!-- quickstart -->` marker sits right above a ```sh fence (tests/integration/
  test_readme_quickstart.py runs those blocks against a live stack).

No database and no service: plain tests.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]
README_MAX_LINES = 250
TABLE_CELL_MAX_CHARS = 300

# The only places a link may leave the repository for: public documentation.
PUBLIC_DOC_HOSTS = {
    "docs.djangoproject.com",
    "docs.celeryq.dev",
    "channels.readthedocs.io",
    "www.django-rest-framework.org",
    "drf-spectacular.readthedocs.io",
    "django-environ.readthedocs.io",
    "django-axes.readthedocs.io",
    "whitenoise.readthedocs.io",
    "modelcontextprotocol.io",
    "platform.openai.com",
    "www.postgresql.org",
    "redis.io",
    "docs.python.org",
    "pytest-django.readthedocs.io",
    "schemathesis.readthedocs.io",
    "playwright.dev",
    "agentskills.io",  # the Agent Skills specification
}
SHELL_FENCES = {"", "sh", "bash", "shell", "console", "zsh"}
# Only in .venv/bin: a bare one fails on a fresh clone.
VENV_ONLY = {"python", "python3", "pip", "pip3", "celery", "daphne", "pytest", "ruff", "django-admin"}

FENCE = re.compile(
    r"^(?P<indent> {0,3})(?P<ticks>`{3,}|~{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)(?P=ticks)[ \t]*$",
    re.M | re.S,
)
# A code span: a run of backticks up to the next run of the same length, within one paragraph.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); the text may hold code spans and brackets one deep.
INLINE_LINK = re.compile(
    r"!?\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
AUTOLINK = re.compile(r"<(?P<target>(?:https?|ftp|file|mailto):[^>\s]+)>")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(?P<text>.+?)[ \t#]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"(?P<id>[^\"]+)\"", re.I)


# --- reading Markdown ----------------------------------------------------------------------------


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string's first word, body) of every fenced code block."""
    return [((m.group("info").split() or [""])[0].lower(), m.group("body")) for m in FENCE.finditer(text)]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, every character that is not a
    letter, digit, space, hyphen or underscore removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = without_fences(page.read_text())
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in HEADING.finditer(text):
        slug = github_slug(match.group("text"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    found.update(m.group("id") for m in HTML_ANCHOR.finditer(text))
    return found


def link_targets(page: Path) -> list[str]:
    """Every link target outside code: inline links and images, reference definitions, autolinks."""
    text = without_fences(page.read_text())
    spans = [m.span() for m in CODE_SPAN.finditer(text)]

    def in_code(position: int) -> bool:
        return any(start <= position < end for start, end in spans)

    targets = [m.group("target") for m in INLINE_LINK.finditer(text) if not in_code(m.start())]
    targets += [m.group("target") for m in REFERENCE_DEFINITION.finditer(text) if not in_code(m.start())]
    targets += [m.group("target") for m in AUTOLINK.finditer(text) if not in_code(m.start())]
    return targets


def link_problem(page: Path, target: str) -> str | None:
    if not target:
        return "empty link target"
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        if (parts.hostname or "") not in PUBLIC_DOC_HOSTS:
            return f"leaves the repository for {parts.hostname!r}, not a public documentation site"
        return None
    if parts.scheme or parts.netloc:
        return f"not a relative link or a public documentation URL (scheme {parts.scheme!r})"
    path = unquote(parts.path)
    if path.startswith("/"):
        return "absolute path: link relative to the page instead"
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.is_relative_to(ROOT):
        return "points outside the repository"
    if not resolved.exists():
        return f"no such file: {resolved.relative_to(ROOT)}"
    if parts.fragment and resolved.suffix == ".md" and parts.fragment not in anchors(resolved):
        return f"no heading with anchor #{parts.fragment} in {resolved.relative_to(ROOT)}"
    return None


# --- reading shell blocks ------------------------------------------------------------------------


def shell_lines(text: str):
    """Each command line of the shell blocks (continuations joined, prompts and comments dropped)."""
    for info, body in fenced_blocks(text):
        if info not in SHELL_FENCES:
            continue
        joined = re.sub(r"\\\n[ \t]*", " ", body)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line and not line.startswith("#"):
                yield line


def segments(line: str) -> list[list[str]]:
    """The simple commands of a line: split at unquoted `|`, `;`, `&&`, `||`, `$(`, `(`, `)` and
    cut at an unquoted comment; each as shlex tokens."""
    pieces, current, quote, i = [], [], None, 0
    while i < len(line):
        char = line[i]
        if quote:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            break
        elif line.startswith("$(", i):
            pieces.append("".join(current))
            current = []
            i += 2
            continue
        elif char in "|;&()":
            pieces.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    pieces.append("".join(current))
    commands = []
    for piece in pieces:
        try:
            tokens = shlex.split(piece)
        except ValueError:
            tokens = piece.split()
        while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            tokens.pop(0)  # VAR=value before the command
        if tokens:
            commands.append(tokens)
    return commands


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


def repository_path(token: str) -> str | None:
    """A token naming a file of the repository (`tests/web`, `.ci/run`, `file=@a/b.csv`), if any;
    `var/` is where commands write, so it is never required to exist."""
    candidate = token.split("@", 1)[1] if "@" in token and not token.startswith("http") else token
    if not re.fullmatch(r"[\w.-]+(?:/[\w.-]+)+/?", candidate):
        return None
    top = candidate.split("/", 1)[0]
    if top in ("var", ".venv", "..") or not (ROOT / top).exists():
        return None
    return candidate


def management_command_problem(tokens: list[str]) -> str | None:
    """`tokens` = [command, args…] after `manage.py`: the command exists and its parser takes args."""
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import CommandError

    if not tokens:
        return "manage.py without a command"
    name, args = tokens[0], tokens[1:]
    commands = get_commands()
    if name not in commands:
        return f"manage.py {name}: no such management command"
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    try:
        parser.parse_args([a for a in args if a != "…"])
    except (CommandError, SystemExit) as exc:
        return f"manage.py {name} {' '.join(args)}: {exc}"
    return None


def command_problems(tokens: list[str]) -> list[str]:
    program, args = tokens[0], tokens[1:]
    problems = []
    if program in VENV_ONLY:
        return [f"bare `{program}`: use .venv/bin/{program} or a make target"]
    if program.startswith(".venv/bin/"):
        tool = program.removeprefix(".venv/bin/")
        if not (Path(sys.prefix) / "bin" / tool).exists():
            problems.append(f"{program}: not installed in the virtualenv")
        if tool.startswith("python") and args[:1] == ["manage.py"]:
            problem = management_command_problem(args[1:])
            if problem:
                problems.append(problem)
        elif tool.startswith("python") and args[:1] == ["-m"] and len(args) > 1:
            if importlib.util.find_spec(args[1]) is None:
                problems.append(f"{program} -m {args[1]}: no such module")
    elif program == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        problems += [f"make {t}: no such Makefile target" for t in targets if t not in make_targets()]
    elif "/" in program and not program.startswith(("$", "/")):
        if not (ROOT / program).exists():
            problems.append(f"{program}: no such file in the repository")
    for token in args:
        path = repository_path(token)
        if path and not (ROOT / path).exists():
            problems.append(f"{token}: no such file in the repository")
    return problems


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_link_resolves_in_the_repository_or_is_public_documentation(page):
    problems = [
        f"{target}: {problem}" for target in link_targets(page) if (problem := link_problem(page, target))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_bare_python_or_pip_in_shell_blocks(page):
    bare = [
        line
        for line in shell_lines(page.read_text())
        for tokens in segments(line)
        if tokens[0] in {"python", "python3", "pip", "pip3"}
    ]
    assert not bare, f"use .venv/bin/python (or a make target), never a bare python/pip: {bare}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_shell_command_runs_from_the_repository_root(page):
    problems = [
        f"{line}\n    -> {problem}"
        for line in shell_lines(page.read_text())
        for tokens in segments(line)
        for problem in command_problems(tokens)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_table_cell_is_a_wall_of_text(page):
    long_cells = [
        f"{len(cell.strip())} chars: {cell.strip()[:70]}…"
        for line in without_fences(page.read_text()).splitlines()
        if line.lstrip().startswith("|")
        for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))
        if len(cell.strip()) > TABLE_CELL_MAX_CHARS
    ]
    assert not long_cells, (
        f"table cells over {TABLE_CELL_MAX_CHARS} characters (make them a paragraph or a list):\n"
        + "\n".join(long_cells)
    )


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "move the detail to a page under docs/"
    for command in ("make run", "make test", ".ci/run", "create_api_key"):
        assert command in text
    targets = link_targets(README)
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in targets]
    assert not missing, f"README's 'Where to go next' does not link these pages: {missing}"


def test_readme_quickstart_markers_sit_on_sh_fences():
    lines = README.read_text().splitlines()
    markers = [i for i, line in enumerate(lines) if line.strip() == "<!-- quickstart -->"]
    assert markers, "the README marks no quickstart block"
    misplaced = [i + 1 for i in markers if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh"]
    assert not misplaced, f"<!-- quickstart --> not right above a ```sh fence (README lines {misplaced})"


# --- the checks themselves -------------------------------------------------------------------------


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert github_slug("Troubleshooting: what the sandbox must reach") == (
        "troubleshooting-what-the-sandbox-must-reach"
    )
    assert github_slug("Probing a server: `mcp_probe`") == "probing-a-server-mcp_probe"
    assert github_slug("MCP elicitation: a server's question to a person") == (
        "mcp-elicitation-a-servers-question-to-a-person"
    )
    page = ROOT / "docs" / "api.md"
    assert link_problem(page, "../../shared/spec/CONTRACT.md") == "points outside the repository"
    assert "no such file" in link_problem(page, "nope.md")
    assert "no heading" in link_problem(page, "configuration.md#nope")
    assert link_problem(page, "configuration.md#troubleshooting-what-the-sandbox-must-reach") is None
    assert "leaves the repository" in link_problem(page, "https://example.com/x")
    assert "not a relative link" in link_problem(page, "file:///etc/passwd")
    note = tmp_path / "x.md"
    note.write_text(
        "A ```json fence, unclosed.\n\nSee [`CONTRACT`](../shared/CONTRACT.md) and `[not](a-link.md)`.\n"
        "```sh\n[x](y)\n```\n"
    )
    assert link_targets(note) == ["../shared/CONTRACT.md"]
    assert [
        t[0]
        for t in segments("KEY=$(python manage.py x) && pip install y | .venv/bin/python -c 'a; python b'")
    ] == [
        "python",
        "pip",
        ".venv/bin/python",
    ]
    assert command_problems(["python", "manage.py", "migrate"])
    assert command_problems([".venv/bin/python", "manage.py", "no_such_command"])
    assert command_problems([".venv/bin/python", "manage.py", "create_api_key", "--no-such-flag"])
    assert not command_problems(
        [".venv/bin/python", "manage.py", "create_api_key", "--tenant", "t", "--user", "u"]
    )
    assert command_problems(["make", "no-such-target"])
    assert command_problems(["curl", "-F", "file=@sessions_app/demo_data/nope.csv", "$BASE"])
    assert not command_problems(["curl", "-F", "file=@sessions_app/demo_data/tickets.csv", "$BASE"])
