"""What a workspace file is, established by real parsers: machine checks and previews.

`check_file` is the evidence a delivery record keeps (ARCHITECTURE: the product, not the
model, says whether an artifact is what it claims to be): a CSV parses with `csv`, HTML with
lxml (listing its tables and headings), JSON with `json`, text decodes as UTF-8, an image
opens with Pillow, a PDF with pypdf. `preview` is what the Session page shows of a file: a
table for CSV, sanitized HTML (nh3) for Markdown, numbered text, or a URL for the kinds the
browser renders itself. Both read at most a bounded number of bytes, so a huge or hostile file
cannot stall the worker or the web process.

Both take the tenant's secret `Redactor`: a program given a secret (ARCHITECTURE §7) may have
written it into a file, and what a file holds reaches delivery records, previews and admin
pages only redacted. Text is redacted before it is parsed, rendered or cut to length (a cut must
not leave half a value), and what the parsers extract is redacted again (a CSV cell or an HTML
entity can spell a value the raw text does not).
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from config.safe_markdown import render_markdown

# Files larger than this are listed in a delivery but not parsed.
MAX_CHECK_BYTES = 20 * 1024 * 1024
MAX_HTML_CHECK_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 80_000_000
SAMPLE_ROWS = 50
PREVIEW_ROWS = 100
PREVIEW_TEXT_BYTES = 256 * 1024
# Rendering runs in the web process (about 0.4 MB/s here): bounded so a preview stays well
# under a second and cannot starve other requests of the interpreter.
PREVIEW_MARKDOWN_BYTES = 128 * 1024
MAX_CELL_CHARS = 500
MAX_LISTED = 50

CSV_SUFFIXES = {".csv", ".tsv"}
HTML_SUFFIXES = {".html", ".htm"}
JSON_SUFFIXES = {".json"}
MARKDOWN_SUFFIXES = {".md", ".markdown"}
TEXT_SUFFIXES = {
    ".txt", ".log", ".py", ".js", ".ts", ".css", ".yaml", ".yml", ".toml", ".ini", ".cfg",
    ".xml", ".sh", ".sql", ".rst", ".jsonl", ".svg",
}  # fmt: skip
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"}
PDF_SUFFIXES = {".pdf"}


@dataclass
class Check:
    path: str
    check: str
    ok: bool
    detail: str
    facts: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "check": self.check,
            "ok": self.ok,
            "detail": self.detail,
            "facts": self.facts,
        }


def kind_of(path: str) -> str:
    suffix = Path(path).suffix.lower()
    for kind, suffixes in (
        ("csv", CSV_SUFFIXES),
        ("html", HTML_SUFFIXES),
        ("json", JSON_SUFFIXES),
        ("markdown", MARKDOWN_SUFFIXES),
        ("text", TEXT_SUFFIXES),
        ("image", IMAGE_SUFFIXES),
        ("pdf", PDF_SUFFIXES),
    ):
        if suffix in suffixes:
            return kind
    return "binary"


# Our own table, not the host's /etc/mime.types (which varies by machine and calls `.xyz` a
# chemical); anything else is served as bytes to download.
CONTENT_TYPES = {
    ".html": "text/html", ".htm": "text/html", ".csv": "text/csv", ".tsv": "text/tab-separated-values",
    ".json": "application/json", ".md": "text/markdown", ".markdown": "text/markdown",
    ".txt": "text/plain", ".log": "text/plain", ".py": "text/plain", ".js": "text/plain",
    ".ts": "text/plain", ".css": "text/css", ".yaml": "text/plain", ".yml": "text/plain",
    ".toml": "text/plain", ".ini": "text/plain", ".cfg": "text/plain", ".xml": "application/xml",
    ".sh": "text/plain", ".sql": "text/plain", ".rst": "text/plain", ".jsonl": "text/plain",
    ".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
    ".gif": "image/gif", ".webp": "image/webp", ".bmp": "image/bmp", ".pdf": "application/pdf",
    ".zip": "application/zip", ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}  # fmt: skip


def content_type_of(path: str) -> str:
    guessed = CONTENT_TYPES.get(Path(path).suffix.lower())
    if not guessed:
        return "application/octet-stream"
    if guessed.startswith("text/") or guessed in ("application/json", "image/svg+xml"):
        return f"{guessed}; charset=utf-8"
    return guessed


Redact = Callable[[str], str]


def _unchanged(text: str) -> str:
    return text


def _redact_of(redactor) -> Redact:
    return redactor.redact if redactor else _unchanged


def _cell(value: str, redact: Redact = _unchanged) -> str:
    value = redact(value)
    return value if len(value) <= MAX_CELL_CHARS else value[:MAX_CELL_CHARS] + "…"


def _read_bytes(path: Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig")


def _csv_dialect(path: str):
    return "excel-tab" if path.lower().endswith(".tsv") else "excel"


# --- machine checks ---------------------------------------------------------------------------


def _check_csv(rel: str, data: bytes, redact: Redact) -> Check:
    text = redact(_decode(data))
    rows = list(csv.reader(io.StringIO(text, newline=""), dialect=_csv_dialect(rel), strict=True))
    rows = [row for row in rows if row]  # a trailing blank line is not a row
    if not rows:
        return Check(rel, "csv", False, "the file holds no CSV rows")
    header, body = rows[0], rows[1:]
    widths = {len(row) for row in body}
    ragged = sorted(i + 2 for i, row in enumerate(body) if len(row) != len(header))[:10]
    header = [redact(h) for h in header]
    facts = {
        "rows": len(body),
        "columns": len(header),
        "header": [_cell(h) for h in header],
        "sample_rows": [[_cell(c, redact) for c in row] for row in body[:SAMPLE_ROWS]],
    }
    if ragged:
        facts["ragged_lines"] = ragged
        return Check(
            rel,
            "csv",
            False,
            f"{len(body)} rows, but rows have {sorted(widths)} columns against a header of {len(header)} "
            f"(first at line {ragged[0]})",
            facts,
        )
    return Check(
        rel, "csv", True, f"{len(body)} rows × {len(header)} columns; header: {', '.join(header)}", facts
    )


def _text_of(element, redact: Redact = _unchanged) -> str:
    return " ".join(redact("".join(element.itertext())).split())


def _cells(row) -> list:
    return [cell for cell in row if cell.tag in ("th", "td")]


def _check_html(rel: str, data: bytes, redact: Redact) -> Check:
    import lxml.html
    from lxml import etree

    if not data.strip():
        return Check(rel, "html", False, "the file is empty")
    parser = lxml.html.HTMLParser(recover=True, no_network=True, remove_comments=True)
    document = lxml.html.document_fromstring(data, parser=parser)
    # Scripts and styles are not content a reader sees.
    etree.strip_elements(document, "script", "style", with_tail=False)
    title = document.find(".//title")
    headings = [
        {"level": int(el.tag[1]), "text": _text_of(el, redact)[:200]}
        for el in document.iter("h1", "h2", "h3", "h4", "h5", "h6")
    ][:MAX_LISTED]
    tables = []
    for table in document.iter("table"):
        rows = list(table.iter("tr"))
        first = rows[0] if rows else None
        header_row = first is not None and first.find("th") is not None
        caption = table.find("caption")
        tables.append(
            {
                "id": redact(table.get("id", "")),
                "caption": _text_of(caption, redact)[:200] if caption is not None else "",
                "headers": [_text_of(c, redact)[:100] for c in _cells(first)] if header_row else [],
                "rows": len(rows) - 1 if header_row else len(rows),
                "cells": [
                    [_text_of(c, redact)[:MAX_CELL_CHARS] for c in _cells(tr)] for tr in rows[:SAMPLE_ROWS]
                ],
            }
        )
        if len(tables) >= MAX_LISTED:
            break
    body = document.find("body")
    text_length = len(_text_of(body)) if body is not None else 0
    facts = {
        "title": _text_of(title, redact)[:200] if title is not None else "",
        "headings": headings,
        "tables": tables,
        "text_length": text_length,
        "parse_errors": len(parser.error_log),
    }
    if text_length == 0 and not tables:
        return Check(rel, "html", False, "the document parses but has no visible text", facts)
    summary = f"{len(tables)} table(s), {len(headings)} heading(s)"
    if facts["title"]:
        summary += f"; title: {facts['title']}"
    return Check(rel, "html", True, summary, facts)


def _check_json(rel: str, data: bytes, redact: Redact) -> Check:
    value = json.loads(redact(_decode(data)))
    shape = type(value).__name__
    facts: dict = {"type": shape}
    if isinstance(value, dict):
        facts["keys"] = list(value)[:MAX_LISTED]
        return Check(rel, "json", True, f"an object with {len(value)} key(s)", facts)
    if isinstance(value, list):
        facts["items"] = len(value)
        return Check(rel, "json", True, f"an array of {len(value)} item(s)", facts)
    return Check(rel, "json", True, f"a JSON {shape}", facts)


def _check_text(rel: str, data: bytes, check: str, redact: Redact) -> Check:
    text = redact(_decode(data))
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    facts: dict = {"lines": lines, "characters": len(text)}
    if check == "markdown":
        facts["headings"] = [
            line.lstrip("#").strip()[:200] for line in text.splitlines() if line.startswith("#")
        ][:MAX_LISTED]
    if not text.strip():
        return Check(rel, check, False, "the file is empty", facts)
    return Check(rel, check, True, f"UTF-8 text, {lines} line(s)", facts)


def _check_image(rel: str, path: Path) -> Check:
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
        with Image.open(path) as image:
            image.verify()
            facts = {"format": image.format, "width": image.width, "height": image.height}
    return Check(rel, "image", True, f"{facts['format']} image, {facts['width']}×{facts['height']}", facts)


def _check_pdf(rel: str, path: Path) -> Check:
    from pypdf import PdfReader

    reader = PdfReader(path, strict=False)
    pages = len(reader.pages)
    facts = {"pages": pages}
    if pages == 0:
        return Check(rel, "pdf", False, "the PDF has no pages", facts)
    return Check(rel, "pdf", True, f"PDF, {pages} page(s)", facts)


def check_file(path: Path, rel: str, redactor=None) -> Check:
    """The machine check for one file, chosen by its name; never raises for bad content.
    `redactor` (tools_app.secrets.Redactor): the tenant's secrets, masked in all it reports."""
    check = _check_file(path, rel, _redact_of(redactor))
    if redactor:
        check.detail = redactor.redact(check.detail)
        check.facts = redactor.redact_data(check.facts)
    return check


def _check_file(path: Path, rel: str, redact: Redact) -> Check:
    kind = kind_of(rel)
    try:
        size = path.stat().st_size
        limit = MAX_HTML_CHECK_BYTES if kind == "html" else MAX_CHECK_BYTES
        if size > limit:
            return Check(
                rel, kind, False, f"{size:,} bytes: too large to check (limit {limit:,})", {"size": size}
            )
        if kind == "image":
            return _check_image(rel, path)
        if kind == "pdf":
            return _check_pdf(rel, path)
        if kind == "binary":
            return Check(
                rel, "exists", True, f"{size} bytes (no parser for this kind of file)", {"size": size}
            )
        data = _read_bytes(path, MAX_CHECK_BYTES)
        if kind == "csv":
            return _check_csv(rel, data, redact)
        if kind == "html":
            return _check_html(rel, data, redact)
        if kind == "json":
            return _check_json(rel, data, redact)
        return _check_text(rel, data, kind, redact)
    except UnicodeDecodeError as exc:
        return Check(rel, kind, False, f"not UTF-8 text (first bad byte at offset {exc.start})")
    except (csv.Error, ValueError) as exc:
        return Check(rel, kind, False, f"does not parse: {str(exc)[:300]}")
    except OSError as exc:
        return Check(rel, kind, False, f"could not be read: {exc.strerror or exc}")
    except Exception as exc:  # a parser's own failure on hostile input is a failed check, not a crash
        return Check(rel, kind, False, f"does not open as {kind}: {type(exc).__name__}: {str(exc)[:300]}")


# --- previews ---------------------------------------------------------------------------------


def _looks_like_text(path: Path) -> bool:
    head = _read_bytes(path, 8192)
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3  # only a character cut at the end of the sample
    return True


def is_text_file(path: Path, rel: str) -> bool:
    """Whether the files API serves `path` as text (secrets masked) rather than as opaque bytes:
    the text kinds by name, and an unknown kind whose first bytes are UTF-8 without NUL."""
    kind = kind_of(rel)
    if kind in ("csv", "html", "json", "markdown", "text"):
        return True
    return kind == "binary" and _looks_like_text(path)


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def preview(path: Path, rel: str, raw_url: str, redactor=None) -> dict:
    """What the Session page shows of a file (see the module docstring); never raises for content.

    Counts (`row_count`, `line_count`) cover what was read; `…_exact` says whether that was the
    whole file, `truncated` that it was not. With the tenant's `redactor`, text is shown with
    its secrets masked (the URLs serve bytes redacted the same way: `api/files.py`).
    """
    size = path.stat().st_size
    kind = "image" if rel.lower().endswith(".svg") else kind_of(rel)
    base = {"path": rel, "size": size, "content_type": content_type_of(rel)}
    if kind == "html":
        return {**base, "kind": kind, "url": raw_url, "scripts_url": f"{raw_url}?scripts=1"}
    if kind in ("image", "pdf"):
        return {**base, "kind": kind, "url": raw_url}
    if kind == "binary" and not _looks_like_text(path):
        return {
            **base,
            "kind": "binary",
            "url": raw_url,
            "message": "No preview for this kind of file; download it.",
        }
    limit = PREVIEW_MARKDOWN_BYTES if kind == "markdown" else PREVIEW_TEXT_BYTES
    data = _read_bytes(path, limit + 1)
    truncated = len(data) > limit
    data = data[:limit]
    try:
        text = data.decode("utf-8-sig") if not truncated else data.decode("utf-8-sig", errors="ignore")
    except UnicodeDecodeError:
        return {
            **base,
            "kind": "binary",
            "url": raw_url,
            "message": "Not UTF-8 text; download it to open it.",
        }
    redact = _redact_of(redactor)
    text = redact(text)
    as_text = {
        **base,
        "kind": "text",
        "text": text,
        "line_count": _line_count(text),
        "line_count_exact": not truncated,
        "truncated": truncated,
    }
    if kind == "csv":
        if truncated:
            text = text[: text.rfind("\n") + 1]  # whole rows only
        try:
            reader = csv.reader(io.StringIO(text, newline=""), dialect=_csv_dialect(rel))
            rows = [row for row in reader if row]
        except csv.Error as exc:
            return {**as_text, "message": f"Shown as text: the CSV does not parse ({exc})."}
        header, body = (rows[0], rows[1:]) if rows else ([], [])
        return {
            **base,
            "kind": "csv",
            "header": [_cell(h, redact) for h in header],
            "rows": [[_cell(c, redact) for c in row] for row in body[:PREVIEW_ROWS]],
            "row_count": len(body),
            "row_count_exact": not truncated,
            "column_count": len(header),
            "truncated": truncated,
        }
    if kind == "markdown":
        return {**base, "kind": "markdown", "html": render_markdown(text), "truncated": truncated}
    return as_text
