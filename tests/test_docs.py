"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link, a
missing anchor, a page left out of the nav or an API reference that no longer resolves
fails), and the README stays a front page whose links lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import hang_guard_s

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# a front page, not a manual: the rest lives in docs/
README_MAX_LINES = 220
# history belongs in CHANGELOG.md, not in what users read
CHANGELOG_PHRASES = (
    "used to be possible",
    "before this version",
    "re-measured",
    "measured again",
    "this round",
    "was once possible",
)


@pytest.mark.slow
def test_site_builds_strict(tmp_path: Path) -> None:
    # a subprocess: the same command CI and `make docs` run, with mkdocs' own strict mode
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=hang_guard_s(900),  # a hang guard
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "api" / "pipeline" / "index.html").is_file()


def test_readme_is_a_front_page() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    first_block = text.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "README.md links into docs/"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_quick_start_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the quick start as printed: it stops after batch 100, saves, restores into a freshly
    # built pipeline and takes batch 101, which must equal an uninterrupted run's
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md quick start", "exec"), scope)
    with scope["build"]().iterate() as it:
        reference = [next(it) for _ in range(101)][100]
    resumed = scope["batch_101"]
    assert sorted(resumed) == sorted(reference)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert (tmp_path / "state.zst").stat().st_size < 4096  # "about 2 KB"


def test_no_changelog_language_in_user_docs() -> None:
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(REPO)}: {phrase!r}"
        for page in pages
        for phrase in CHANGELOG_PHRASES
        if phrase in page.read_text().lower()
    ]
    assert not found, "history goes to CHANGELOG.md: " + "; ".join(found)
