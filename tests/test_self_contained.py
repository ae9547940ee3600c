"""The repository is self-contained: no tracked file refers to a path outside it.

A fresh clone with nothing beside it must test and run, so nothing may read a sibling
checkout (the ``shared`` folder beside a clone), a machine's absolute work directory, or climb out of the tree
with ``..`` path joins.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_DOTDOT = re.escape("..")
OUTSIDE = [
    re.compile(_DOTDOT + r"[/\\]shared\b"),          # a sibling checkout
    re.compile(r"(?<![\w.])/" + "work" + r"/"),        # an absolute path on the build machine
    re.compile(r"/\s*['\"]" + _DOTDOT + r"['\"]"),    # Path(...) / ".." climbing out of the tree
    re.compile(r"\bparents\[\d+\]\s*/\s*['\"]" + _DOTDOT),
]
SKIP_DIRS = {".git", ".venv", "__pycache__", "build", "dist", "node_modules"}


def _tracked_files() -> list[Path]:
    """Files git tracks (plus untracked, not ignored); a plain walk where git is absent."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout
        return [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in REPO.rglob("*")
                if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(REPO).parts)
                and not any(part.endswith(".egg-info") for part in p.parts)]


def offending_lines(files: list[Path]) -> list[str]:
    """``path:line: text`` for every line of ``files`` that names a path outside the repository."""
    hits = []
    for path in files:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files name no paths we could follow
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    return hits


def test_no_file_refers_to_a_path_outside_the_repository():
    files = [p for p in _tracked_files() if p.resolve() != Path(__file__).resolve()]  # its own examples
    assert len(files) > 50
    assert offending_lines(files) == []


def test_the_check_catches_a_sibling_checkout_and_an_absolute_work_path(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    bad = tmp_path / "conftest.py"
    bad.write_text(
        'CORPUS = (REPO / ".." / "' + 'shared" / "corpus")\n'
        "data = open('" + "/work" + "/shared/CASES.md')\n"
        "ok = REPO / 'tests' / 'data'\n"
    )
    hits = offending_lines([bad])
    assert [h.split(":")[1] for h in hits] == ["1", "2"]


def test_the_corpus_the_tests_read_is_in_the_repository():
    corpus = REPO / "tests" / "data" / "corpus"
    names = {p.name for p in corpus.glob("*.xml")}
    assert len(names) >= 15
    sources = (corpus / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in names)
    assert (REPO / "docs" / "cases.md").read_text().startswith("# Cases")
