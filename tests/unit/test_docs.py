"""The documentation as a site (MkDocs, strict: a broken link, a missing anchor or a page outside the nav that a
page links fails the build), and the README as a front page."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "quickstart" / "index.html").exists()


def test_every_guide_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in USER_PAGES[1:] if f": {p.name}" not in nav] == []


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    headings = re.findall(r"^## (.+)$", readme, re.M)
    for wanted in (
        "Install",
        "Quick start",
        "Serve your own model",
        "Features",
        "Figures",
        "Terminology",
        "Limitations",
        "Development",
    ):
        assert wanted in headings


def test_user_pages_carry_no_commit_hashes():
    found = {
        p.name: hits
        for p in USER_PAGES
        if (hits := [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", p.read_text()) if not h.isdigit()])
    }
    assert found == {}
