"""Markdown as safe HTML, the one recipe for every preview (workspace files, Skill bodies in
admin): markdown-it with raw HTML off, then nh3 with an allow-list."""

from __future__ import annotations

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "i", "li", "ol", "p", "pre", "s", "strong", "sub", "sup", "table", "tbody", "td", "th",
    "thead", "tr", "ul",
}  # fmt: skip


def render_markdown(text: str) -> str:
    import nh3
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    # Links keep their text and target but open nothing in the app's window; no images
    # from elsewhere (the product works offline and a preview must not call out).
    return nh3.clean(
        rendered,
        tags=ALLOWED_TAGS,
        attributes={"a": {"href", "title"}, "th": {"align"}, "td": {"align"}},
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
