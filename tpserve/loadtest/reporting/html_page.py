"""A report's markdown as a standalone HTML page beside it, for reading in a browser.

Reports are written as markdown first (they diff well and read on any forge); the page carries the same tables and
plots. Raw HTML inside the markdown is shown as text, never run: a report quotes names a server chose.
"""

from __future__ import annotations

import html
from pathlib import Path

STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:110em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%}"
    "pre{background:#f6f6f6;padding:1em;overflow-x:auto}"
)


def render(text: str) -> str:
    """Markdown text to an HTML fragment: tables, fenced code; raw HTML escaped rather than passed through."""
    import markdown

    md = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md.convert(text)


def write_html(markdown_path: Path) -> Path:
    """Write <name>.html beside <name>.md (images stay relative, so the folder reads anywhere); return its path."""
    text = markdown_path.read_text()
    title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), markdown_path.stem)
    page = markdown_path.with_suffix(".html")
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{render(text)}</body></html>\n"
    )
    return page
