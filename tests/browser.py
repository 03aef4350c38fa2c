"""A headless browser for the report tests: Debian's chromium-headless-shell, unpacked into .tools/chromium.

`python -m tests.browser` (`make install-browser`) fetches the shell, its common files and the shared libraries
it needs that this host lacks, and unpacks them with common.debian_packages: no root, nothing installed
system-wide. `open_page` loads a page through Playwright driving that binary and returns what a reader meets:
its tables and images, every console error, every request that failed, every local link that leads nowhere.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools" / "chromium"
WRAPPER = TOOLS / "chromium"
PACKAGE = "chromium-headless-shell"
KEEP = (PACKAGE, "chromium-common")  # besides the shared libraries (lib*) the host lacks


@dataclass(frozen=True)
class Page:
    """What a reader of one page meets."""

    title: str
    tables: int
    rows: int
    images: int
    drawn: int  # canvas and svg elements: charts drawn by script
    broken_images: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not WRAPPER.exists():
        return f"no headless browser in {TOOLS}: `make install-browser` fetches Debian's {PACKAGE} (needs apt)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (make install)"
    return None


def install() -> Path:
    """The wrapper script that runs the shell with its libraries (idempotent)."""
    from tpserve.common.debian_packages import Apt, installed, unpack

    if WRAPPER.exists():
        return WRAPPER
    with tempfile.TemporaryDirectory(prefix="chromium-") as scratch:
        apt = Apt(Path(scratch))
        wanted = [p for p in apt.depends(PACKAGE) if (p in KEEP or p.startswith("lib")) and not installed(p)]
        print(f"browser: fetching {len(wanted)} Debian packages ({PACKAGE} and what this host lacks) into {TOOLS}")
        partial = TOOLS.with_name("chromium.partial")
        shutil.rmtree(partial, ignore_errors=True)
        (partial / "tree").mkdir(parents=True)
        for deb in apt.download(wanted):
            unpack(deb, partial / "tree")
        _write_wrapper(partial)
        shutil.rmtree(TOOLS, ignore_errors=True)
        partial.rename(TOOLS)  # whole or not at all
    return WRAPPER


def _write_wrapper(folder: Path) -> None:
    libs = sorted({str(p.parent.relative_to(folder)) for p in (folder / "tree").rglob("*.so*") if p.is_file()})
    path = ":".join(f'"$here/{lib}"' for lib in libs)
    folder.joinpath("chromium").write_text(
        "#!/bin/sh\n"
        'here=$(dirname "$(readlink -f "$0")")\n'
        f"LD_LIBRARY_PATH={path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
        f'exec "$here/tree/usr/lib/chromium/{PACKAGE}" "$@"\n'
    )
    folder.joinpath("chromium").chmod(0o700)


# what the page's script collects once loaded: tables, rows, images that did not load, links
_SURVEY = """() => ({
  title: document.title,
  tables: document.querySelectorAll('table').length,
  rows: document.querySelectorAll('tr').length,
  images: document.images.length,
  drawn: document.querySelectorAll('canvas, svg').length,
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
})"""


def open_page(path: Path, wait_ms: int = 500) -> Page:
    """Load path in the headless browser and survey it."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    failed: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(WRAPPER))
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_timeout(wait_ms)  # scripts that draw after load
            found = page.evaluate(_SURVEY)
        finally:
            browser.close()
    return Page(
        title=found["title"],
        tables=found["tables"],
        rows=found["rows"],
        images=found["images"],
        drawn=found["drawn"],
        broken_images=found["broken"],
        console_errors=errors,
        failed_requests=failed,
        broken_links=[h for h in found["links"] if not _resolves(path, h)],
    )


def _resolves(page: Path, href: str) -> bool:
    """A local link leads to a file beside the page; an anchor or a web address is not checked here."""
    if href.startswith(("#", "http://", "https://", "mailto:")):
        return True
    target = href.split("#", 1)[0].split("?", 1)[0]
    return not target or (page.parent / target).exists()


if __name__ == "__main__":
    try:
        print(install())
    except Exception as err:  # the tests skip, saying why
        sys.exit(f"browser unavailable: {err}")
