"""The manual (README.md, docs/, mkdocs.yml): the benchmark tables equal what the JSON results say,
every relative link and image resolves, every page is in the site's nav, README.md keeps its two
commands first, and `mkdocs build --strict` succeeds when mkdocs is installed. No build needed."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import unicodedata

import pytest

import gen_docs_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HTML = re.compile(r"<(?:img|a)\s[^>]*?(?:src|href)=\"([^\"]+)\"")


def _prose(text: str) -> str:
    """`text` without code blocks, code spans and HTML comments: what a reader sees as links."""
    return _CODE.sub("", _FENCE.sub("", re.sub(r"<!--.*?-->", "", text, flags=re.S)))


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (what mkdocs uses) and GitHub give a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _anchors(page: pathlib.Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def _links(page: pathlib.Path) -> list[str]:
    prose = _prose(page.read_text(encoding="utf-8"))
    return [m.group(1) for m in _LINK.finditer(prose)] + [m.group(1) for m in _HTML.finditer(prose)]


def test_bench_tables_are_up_to_date():
    stale = gen_docs_bench.stale_files(ROOT)
    assert not stale, f"out of date with docs/bench/'s JSON, run `python tools/gen_docs_bench.py --write`: {stale}"
    assert gen_docs_bench.main(["--check"]) == 0


def test_the_bench_check_fails_on_a_stale_table(tmp_path, capsys):
    """The check can fail: a number edited by hand, or a JSON result rewritten, is reported."""
    for source, _ in gen_docs_bench.TABLES.values():
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, tmp_path / source)
    page = tmp_path / "docs" / "benchmarks.md"
    shutil.copy(ROOT / "docs" / "benchmarks.md", page)
    assert gen_docs_bench.main(["--check", "--root", str(tmp_path)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "| 16 | 124.6 (1.86x) |" in text  # bench_batch_toy.json's dual at max_batch 16
    page.write_text(text.replace("| 16 | 124.6 (1.86x) |", "| 16 | 224.6 (1.86x) |"), encoding="utf-8")
    assert gen_docs_bench.stale_files(tmp_path) == [page]
    assert gen_docs_bench.main(["--check", "--root", str(tmp_path)]) == 1
    assert "docs/benchmarks.md is out of date" in capsys.readouterr().err
    assert gen_docs_bench.main(["--write", "--root", str(tmp_path)]) == 0
    assert page.read_text(encoding="utf-8") == text
    # a table whose markers are gone is an error naming it, not a silent pass
    begin, _ = gen_docs_bench.markers("soak")
    page.write_text(text.replace(begin, ""), encoding="utf-8")
    assert gen_docs_bench.main(["--check", "--root", str(tmp_path)]) == 1
    assert "'soak'" in capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert re.search(rf":\s+{re.escape(rel)}\s*$", nav, re.M), f"docs/{rel} is not in mkdocs.yml's nav"


def test_readme_starts_with_the_two_commands():
    """README.md's first two blocks are the setup-and-run and the test commands; CI runs the second
    as written (.ci/run) and the docs' home page shows the same two."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    first, second = blocks[:2]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(f"# BlockBatch\n\n```bash\n{first}\n```\n\n```bash\n{second}\n```\n")
    assert first.endswith(
        'blockbatch generate --policy blockbatch --gen-length 128 "72-2=__-3=__-3=__...............?"'
    )
    assert second.endswith("python -m pytest -q tests")
    assert second in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert f"```bash\n{first}\n```\n\n```bash\n{second}\n```" in index
    assert len(readme.splitlines()) <= 200, "README.md is the front page: 200 lines at most, the rest goes in docs/"


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "mkdocstrings_handlers.python")),
    reason="mkdocs, mkdocs-material or mkdocstrings[python] is not installed "
    '(pip install mkdocs mkdocs-material "mkdocstrings[python]")',
)
def test_mkdocs_build_strict(tmp_path):
    """The site builds with --strict: a broken link or anchor, a page missing from the nav or an API
    reference that does not resolve fails (what .ci/run's lint step runs)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    assert (tmp_path / "site" / "python-api" / "index.html").read_text(encoding="utf-8").count(
        'id="blockbatch.Engine'
    ) > 1
    assert (tmp_path / "site" / "bench" / "soak.png").exists()
