"""The built documentation site works on its own: every internal link and anchor of every page
resolves, the code pages that mkdocs_hooks.py generates put each line at its `#L<n>` anchor, and
every page has a title of its own.

tests/test_docs.py checks the Markdown sources against the repository (a line link lands on the
marker it names); the tests here check what a reader of the built site gets.
"""

import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from conftest import HUNG_AFTER, REPO

SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_LINK = re.compile(r"\]\(((?:\.\./)+(?:ppo|benchmark)/[^)#\s]+)#(L\d+)")


class PageParser(HTMLParser):
    """The ids, links, title and first heading of an HTML page, and the text of each line of a
    generated code page (`<span class="line" id="L<n>">`, its number in an `<a class="lineno">`)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.title = ""
        self.h1 = ""
        self.lines: dict[int, str] = {}
        self._in = []  # what text goes to: "title", "h1", ("line", n), ("lineno", n)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key) is not None and tag in ("a", "link", "script", "img",
                                                      "iframe", "source"):
                self.links.append(attrs[key])
        if tag == "title":
            self._in.append("title")
        elif tag == "h1" and not self.h1:
            self._in.append("h1")
        elif (tag == "span" and "line" in (attrs.get("class") or "").split()
              and attrs.get("id", "").startswith("L")):
            number = int(attrs["id"][1:])
            self.lines[number] = ""
            self._in.append(("line", number))
        elif tag == "a" and "lineno" in (attrs.get("class") or "").split() and self._in:
            self._in.append(("lineno", self._in[-1][1]))
        elif self._in:
            self._in.append(None)  # a nested element: its text belongs to the enclosing one

    def handle_endtag(self, tag):
        if self._in:
            self._in.pop()

    def handle_data(self, data):
        target = next((entry for entry in reversed(self._in) if entry is not None), None)
        if target == "title":
            self.title += data
        elif target == "h1":
            self.h1 += data
        elif isinstance(target, tuple) and target[0] == "line":
            self.lines[target[1]] += data


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)], cwd=config.parent,
                          capture_output=True, text=True, timeout=HUNG_AFTER)


class Site:
    """A built site: its folder and every HTML page in it, parsed."""

    def __init__(self, root: Path):
        self.root = root
        self.pages: dict[Path, PageParser] = {}
        for path in sorted(root.rglob("*.html")):
            self.pages[path] = PageParser()
            self.pages[path].feed(path.read_text())


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """The repository's site, built once for this module."""
    pytest.importorskip("mkdocs")
    root = tmp_path_factory.mktemp("site") / "site"
    result = build_site(REPO / "mkdocs.yml", root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Site(root)


def resolve(root: Path, page: Path, link: str) -> tuple[Path | None, str]:
    """(file, fragment) that a relative link of a page points to; None for a link off the site."""
    if SCHEME.match(link) or link.startswith("//"):
        return None, ""
    base = "http://site/" + page.relative_to(root).as_posix()
    parts = urlsplit(urljoin(base, link))
    target = root / unquote(parts.path).lstrip("/")
    if parts.path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_every_internal_link_and_anchor_resolves(site):
    root = site.root
    dead, checked, anchors = [], 0, 0
    for page, parsed in site.pages.items():
        for link in parsed.links:
            target, fragment = resolve(root, page, link)
            if target is None:
                continue
            checked += 1
            where = f"{page.relative_to(root)}: {link}"
            if not target.is_file():
                dead.append(f"{where} (no {target.relative_to(root)})")
            elif fragment and target.suffix == ".html":
                anchors += 1
                if fragment not in site.pages[target].ids:
                    dead.append(f"{where} (no #{fragment} in {target.relative_to(root)})")
    # The pages' line links alone are well over a hundred: a crawl that finds few saw nothing.
    assert checked > 1000 and anchors > 150, (checked, anchors)
    assert not dead, f"{len(dead)} dead links or anchors:\n" + "\n".join(dead[:50])


def test_each_line_anchor_of_a_code_page_holds_that_line(site):
    root = site.root
    pages = 0
    for pattern in ("ppo/*.py", "benchmark/*.py", "benchmark/*.sh", "benchmark/*.toml"):
        for source in sorted(REPO.glob(pattern)):
            relative = source.relative_to(REPO).as_posix()
            page = root / "source" / relative / "index.html"
            assert page.is_file(), f"no page for {relative}"
            lines = source.read_text().splitlines()
            shown = site.pages[page].lines
            assert sorted(shown) == list(range(1, len(lines) + 1)), relative
            wrong = [n for n in shown if shown[n] != lines[n - 1]]
            assert not wrong, (f"{relative}: #L{wrong[0]} shows {shown[wrong[0]]!r}, not "
                               f"{lines[wrong[0] - 1]!r}")
            pages += 1
    assert pages >= 9


def test_the_site_keeps_every_line_link_of_the_markdown(site):
    """Each `../ppo/<script>.py#L<n>` of a page becomes a link to `source/ppo/<script>.py/#L<n>` on
    the built page, so the line anchors tests/test_docs.py checks are the ones a reader follows."""
    root = site.root
    missing = []
    for markdown in sorted((REPO / "docs").rglob("*.md")):
        relative = markdown.relative_to(REPO / "docs").with_suffix("")
        html = (root / relative / "index.html" if relative.name != "index"
                else root / relative.parent / "index.html")
        built = set()
        for link in site.pages[html].links:
            target, fragment = resolve(root, html, link)
            if target is not None and fragment and target.is_relative_to(root / "source"):
                built.add((target.parent.relative_to(root / "source").as_posix(), fragment))
        for script_link, line in LINE_LINK.findall(markdown.read_text()):
            script = (markdown.parent / script_link).resolve().relative_to(REPO).as_posix()
            if (script, line) not in built:
                missing.append(f"{markdown.relative_to(REPO)}: {script_link}#{line}")
    assert not missing, "line links missing from the built pages:\n" + "\n".join(missing)


def test_every_page_has_a_title_of_its_own(site):
    root = site.root
    titles, headings = {}, {}
    for page, parsed in site.pages.items():
        if page.name in ("404.html", "search.html"):
            continue
        titles.setdefault(parsed.title.strip(), []).append(str(page.relative_to(root)))
        headings.setdefault(parsed.h1.replace("¶", "").strip(),
                            []).append(str(page.relative_to(root)))
    shared = {title: pages for title, pages in {**titles, **headings}.items() if len(pages) > 1}
    assert not shared, f"titles shared by several pages: {shared}"


def test_a_link_to_an_unpublished_file_fails_the_strict_build(tmp_path):
    """The hook publishes the code and points the pages' links at it; a link that leaves docs/ for
    anything else is still reported, and fails the strict build."""
    pytest.importorskip("mkdocs")
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "demo.py").write_text("a = 1\nb = 2  # [Core 5: GAE]\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text(textwrap.dedent(f"""\
        site_name: demo
        hooks:
          - {REPO / "mkdocs_hooks.py"}
        not_in_nav: |
          /source/
        validation:
          links:
            not_found: warn
            anchors: warn
        """))
    page = tmp_path / "docs" / "index.md"
    page.write_text("# Demo\n\n[`[Core 5: GAE]`](../ppo/demo.py#L2)\n")
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    built = (tmp_path / "site" / "index.html").read_text()
    assert 'href="source/ppo/demo.py/#L2"' in built
    assert ('<span class="line" id="L2">'
            in (tmp_path / "site" / "source" / "ppo" / "demo.py" / "index.html").read_text())

    page.write_text("# Demo\n\n[the tests](../tests/test_demo.py)\n")
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "../tests/test_demo.py" in result.stderr
