"""MkDocs hook (mkdocs.yml `hooks:`): publish the code the pages link to, so the site works on its own.

The Markdown pages link to the scripts the way GitHub reads them, relative to the repository:
`[GAE](../ppo/ppo.py#L213)`. Those files live outside docs/, so a plain `mkdocs build` would leave
every such link dead. This hook

- adds a generated page for each published file (SOURCES below) under `source/`, the file's text
  with one anchor per line: `source/ppo/ppo.py/#L213` is line 213, and its number links to itself;
- adds `source/index.md`, the list of those pages (the nav's "Source code" entry);
- rewrites, in the Markdown handed to the renderer (never in the files on disk), each link to a
  published file into a link to its page, keeping the line anchor (a range `#L10-L20` keeps its
  first line).

A link that leaves docs/ for a file that is not published stays as it is, and mkdocs reports it as
not found: with `validation.links.not_found: warn`, `mkdocs build --strict` fails on it.
"""

import html
import posixpath
import re
from pathlib import Path
from urllib.parse import unquote

from mkdocs.structure.files import File, InclusionLevel

# The files published as pages, relative to the repository root (the folder of mkdocs.yml).
SOURCES = ("ppo/*.py", "ppo_utils/*.py", "benchmark/*.py", "benchmark/runner/*.py", "benchmark/reporter/*.py",
           "benchmark/timer/*.py", "benchmark/tuner/*.py", "benchmark/*.sh", "benchmark/*.toml")
SOURCE_DIR = "source"  # where their pages go on the site
CSS_URI = "assets/source-listing.css"

CSS = """\
.wy-nav-content:has(.source-listing) { max-width: 1200px; }
.source-listing { line-height: 1.45; font-size: 12px; padding: 8px 0; overflow-x: auto; }
.source-listing .line { display: block; min-width: max-content; padding-right: 12px; white-space: pre;
  scroll-margin-top: 6em; }
.source-listing .line:target { background: #fff3b0; }
.source-listing .lineno { display: inline-block; width: 4.5em; padding-right: 1.2em; text-align: right;
  color: #999; user-select: none; text-decoration: none; }
.source-listing .lineno:hover { color: #2980b9; }
"""

FENCE = re.compile(r"^\s*(```|~~~)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# An inline link's target: [text](target) or [text](<target> "title"); and a reference definition.
INLINE_TARGET = re.compile(r"(\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
REFERENCE_TARGET = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s+\"[^\"]*\")?\s*)$")
LINE_RANGE = re.compile(r"^(L\d+)-L\d+$")


def repository_root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def published_files(config) -> list[str]:
    """The repository paths (posix, relative to the root) of the files that get a page."""
    root = repository_root(config)
    found = {path.relative_to(root).as_posix() for pattern in SOURCES for path in root.glob(pattern)
             if path.is_file()}
    return sorted(found)


def page_uri(path: str) -> str:
    """The generated page of a repository file: ppo/ppo.py -> source/ppo/ppo.py.md."""
    return f"{SOURCE_DIR}/{path}.md"


def source_page(path: str, text: str) -> str:
    """The Markdown of a file's page: a heading, a line about the anchors, the text with one id per line."""
    lines = text.splitlines()
    body = "".join(  # block-level lines: no newline between them, or <pre> would show it as a blank line
        f'<span class="line" id="L{number}"><a class="lineno" href="#L{number}">{number}</a>'
        f"{html.escape(line, quote=False)}</span>"
        for number, line in enumerate(lines, start=1))
    return (f"# Source: `{path}`\n\n"
            f"`{path}` as this site was built from it, {len(lines)} lines. Each line number links to its "
            f"line: `#L{min(12, len(lines))}` at the end of this page's address is line {min(12, len(lines))}. "
            f"[All published files]({posixpath.relpath(f'{SOURCE_DIR}/index.md', posixpath.dirname(page_uri(path)))})\n\n"
            f'<pre class="source-listing">{body}</pre>\n')


def index_page(paths: list[str]) -> str:
    items = "\n".join(f"- [`{path}`]({posixpath.relpath(page_uri(path), SOURCE_DIR)})" for path in paths)
    return ("# Source code\n\n"
            "The scripts and the benchmark's files, as this site was built from them, with numbered lines. "
            "The pages link to them where they discuss a line of code.\n\n"
            f"{items}\n")


def on_config(config):
    if CSS_URI not in config.extra_css:
        config.extra_css.append(CSS_URI)
    return config


def on_files(files, config):
    root = repository_root(config)
    paths = published_files(config)
    for path in paths:
        files.append(File.generated(config, page_uri(path), content=source_page(path, (root / path).read_text()),
                                    inclusion=InclusionLevel.NOT_IN_NAV))
    files.append(File.generated(config, f"{SOURCE_DIR}/index.md", content=index_page(paths)))
    files.append(File.generated(config, CSS_URI, content=CSS))
    return files


def site_target(target: str, page_src_uri: str, config, published: set[str]) -> str:
    """The link the site needs for a link written relative to the page's Markdown file."""
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return target
    path, hash_sign, fragment = target.partition("#")
    if not path:
        return target
    docs_dir = Path(config.docs_dir).resolve()
    resolved = ((docs_dir / page_src_uri).parent / unquote(path.partition("?")[0])).resolve()
    root = repository_root(config)
    if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(root):
        return target  # a page or file of the site, or nothing of the repository: mkdocs checks it
    repository_path = resolved.relative_to(root).as_posix()
    if repository_path not in published:
        return target  # left for mkdocs to report as not found
    new = posixpath.relpath(page_uri(repository_path), posixpath.dirname(page_src_uri) or ".")
    if fragment:
        fragment = LINE_RANGE.sub(r"\1", fragment)
    return new + (f"#{fragment}" if hash_sign else "")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(f"{SOURCE_DIR}/"):
        return markdown
    published = set(published_files(config))
    src_uri = page.file.src_uri
    out = []
    in_fence = False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            line = INLINE_TARGET.sub(
                lambda m: m.group(1) + site_target(m.group(2), src_uri, config, published) + m.group(3), line)
            line = REFERENCE_TARGET.sub(
                lambda m: m.group(1) + site_target(m.group(2), src_uri, config, published) + m.group(3), line)
        out.append(line)
    return "\n".join(out)
