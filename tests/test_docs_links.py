"""Every relative link of the README and of the documentation site resolves: the file it names exists, and so
does the heading it points at (``page.md#anchor``). The README is read on the repository's web page, so its
anchors are the ones such a page makes; the site's are the ones its Markdown table of contents makes, as
``mkdocs build --strict`` checks them too (``make docs``), but this needs no build."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from s3batch.dev.docs import expand

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))

_LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*(?:\{#([\w-]+)\})?\s*$")
_FENCE = re.compile(r"^(```|~~~)")
_ID = re.compile(r'\bid="([\w-]+)"')


def _plain(heading: str) -> str:
    """A heading's text as rendered: code spans, emphasis and links reduced to their words."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return text.replace("`", "").replace("**", "").replace("*", "")


def site_slug(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` gives a heading (its default ``slugify``)."""
    text = unicodedata.normalize("NFKD", _plain(heading)).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def page_slug(heading: str) -> str:
    """The anchor a repository's web page gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", _plain(heading).strip().lower())
    return text.replace(" ", "-")


def outside_fences(text: str) -> str:
    """``text`` without its fenced code blocks (links and headings inside them are examples)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (generated sections included), in both styles, and its ids."""
    text = outside_fences(expand(path.read_text()) if path.is_relative_to(DOCS) else path.read_text())
    found: set[str] = set(_ID.findall(text))  # an explicit <a id="..."></a>
    seen: dict[str, int] = {}
    for line in text.splitlines():
        match = _HEADING.match(line)
        if not match:
            continue
        if match[3]:
            found.add(match[3])
            continue
        for make in (site_slug, page_slug):
            base = make(match[2])
            found.add(base)
            n = seen.get(f"{make.__name__}:{base}", 0)
            if n:
                found.add(f"{base}_{n}" if make is site_slug else f"{base}-{n}")
            seen[f"{make.__name__}:{base}"] = n + 1
    return found


def links(path: Path) -> list[str]:
    text = outside_fences(path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is never a link
    return _LINK.findall(text) + _IMAGE.findall(text)


def broken(path: Path) -> list[str]:
    """The relative links of ``path`` that do not resolve, each with why."""
    found = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            found.append(f"{target}: no file {where.relative_to(ROOT) if where.is_relative_to(ROOT) else where}")
            continue
        if path.is_relative_to(DOCS) and not where.is_relative_to(DOCS):
            found.append(f"{target}: outside docs/ (the site cannot serve it; name the file as code instead)")
            continue
        if anchor and where.suffix == ".md" and anchor not in anchors(where):
            found.append(f"{target}: no heading #{anchor} in {where.relative_to(ROOT)}")
    return found


def test_the_readme_links_resolve() -> None:
    assert links(ROOT / "README.md"), "the README links into the site"
    assert not broken(ROOT / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_site_links_resolve(page: Path) -> None:
    assert not broken(page)


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w./-]+\.md)\s*$", nav, flags=re.M))
    missing = [str(p.relative_to(DOCS)) for p in PAGES if str(p.relative_to(DOCS)) not in listed]
    assert not missing, f"pages no one can reach from the site's navigation: {missing}"


def test_the_slugs_are_the_ones_both_renderers_make() -> None:
    assert site_slug("Schedules, incremental runs and backfill") == "schedules-incremental-runs-and-backfill"
    assert site_slug("`s3batch start`") == "s3batch-start"
    assert page_slug("After a file is processed: archive, delete or tag it") == (
        "after-a-file-is-processed-archive-delete-or-tag-it"
    )
    assert page_slug("Upgrading workers -- with jobs") == "upgrading-workers----with-jobs"


def test_the_readme_is_a_front_page() -> None:
    """At most 300 lines; its test command is the one .ci/run calls; it leads into each part of the site."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, "the README is a front page: the rest belongs in docs/"
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    testing = readme.split("\n## Testing", 1)[1]
    assert "`make test`" in testing and "docs/development.md" in testing
    for part in ("tutorials", "how-to", "reference", "explanation"):
        assert f"(docs/{part}/index.md)" in readme, part
