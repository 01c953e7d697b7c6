"""The documentation: the site builds in strict mode, every relative link resolves, and every link
to a line of a script still points at the implementation detail it names.

The pages link to the scripts relative to the repository (../ppo/ppo.py#L123), as GitHub reads them;
the checks here hold those links to the repository's files. On the site, mkdocs_hooks.py publishes
the scripts as pages with line anchors and points the links at them: tests/test_site.py checks the
built site.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import HUNG_AFTER, REPO

# A line link passes when the line it names (or a line of the range it names) carries the marker of
# the detail it names: a link even one line off points a reader at the wrong code.
MARKER_WINDOW = 0
# The kinds of detail markers the scripts use: `[Core 5: ...]`, `[Atari 2: ...]`, ...
DETAIL_KINDS = ("Core", "Atari", "Continuous", "LSTM", "Multi-GPU")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s")
# [text](target "title") and ![alt](target); the text may hold one level of brackets:
# [`[Core 5: GAE]`](...)
INLINE_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_LINK = re.compile(r"\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
LINE_FRAGMENT = re.compile(r"^L(\d+)(?:-L(\d+))?$")


def markdown_files() -> list[Path]:
    """The pages of the site and the README."""
    files = sorted((REPO / "docs").glob("**/*.md"))
    if (REPO / "README.md").exists():
        files.append(REPO / "README.md")
    return files


def detail_kinds() -> list[str]:
    """Marker kinds: the known ones plus any a script uses (`[Procgen 1: ...]` would add
    Procgen)."""
    kinds = set(DETAIL_KINDS)
    for script in (REPO / "ppo").glob("*.py"):
        kinds.update(re.findall(r"\[([A-Z][A-Za-z-]*) \d+:", script.read_text()))
    return sorted(kinds)


def named_markers(text: str, kinds: list[str]) -> list[tuple[str, int]]:
    """The details a piece of text names, as (kind, number): "Core 5" -> ("Core", 5)."""
    pattern = re.compile(rf"\b({'|'.join(map(re.escape, kinds))})\s+(\d+)\b")
    return [(kind, int(number)) for kind, number in pattern.findall(text)]


def links(path: Path, kinds: list[str]) -> list[dict]:
    """Every link of a markdown file outside code blocks, with what it needs for the checks:
    its line, text, target and the detail markers it refers to (from its text, else its table row,
    else the row's number in a table of a section that announces `[Kind N: ...]` markers)."""
    found = []
    in_fence = False
    section_kind = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if HEADING.match(line):
            section_kind = next((kind for kind in kinds
                                 if re.search(rf"\b{kind}\b", line, re.IGNORECASE)), None)
        announced = re.search(rf"\[({'|'.join(kinds)}) N\b", line)
        if announced:
            section_kind = announced.group(1)
        is_row = line.lstrip().startswith("|")
        row_markers = named_markers(line, kinds) if is_row else []
        if is_row and not row_markers and section_kind:
            first_cell = line.strip().strip("|").split("|")[0].strip()
            if first_cell.isdigit():
                row_markers = [(section_kind, int(first_cell))]
        entries = [(text, target) for text, target in INLINE_LINK.findall(line)]
        entries += [("", target) for target in HTML_LINK.findall(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            entries.append(("", definition.group(1)))
        for text, target in entries:
            found.append({"file": path, "line": number, "text": text, "target": target,
                          "markers": named_markers(text, kinds) or row_markers})
    return found


def local_target(link: dict) -> tuple[Path, str] | None:
    """(resolved file, fragment) of a relative link; None for web links, anchors and absolute
    paths."""
    target = link["target"]
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return None
    path, _, fragment = target.partition("#")
    path = path.partition("?")[0]
    return (link["file"].parent / unquote(path)).resolve(), fragment


def display(path: Path) -> str:
    """A file's path for messages: relative to the repository when it lies in it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def marker_lines(script: Path, kind: str, number: int) -> list[int]:
    """The lines of a script that carry the marker `[kind number: ...]` (or `[kind number]`), where
    the detail happens: not the module docstring, which names markers as an example and an index."""
    source = script.read_text()
    module = ast.parse(source)
    docstring_end = module.body[0].end_lineno if ast.get_docstring(module) is not None else 0
    pattern = re.compile(rf"\[{re.escape(kind)} {number}[:\]]")
    return [i for i, line in enumerate(source.splitlines(), start=1)
            if i > docstring_end and pattern.search(line)]


def named_line(script: Path, text: str) -> tuple[str, list[int]] | None:
    """For a link whose text names a `[Speed: ...]` marker or a name in code, that name and the
    lines that carry it: a function or class of the script, its definition; `module.name`, the lines
    that use it; any other name, the lines that hold it. None for texts that name nothing
    ("here")."""
    source = script.read_text().splitlines()
    speed = re.search(r"\[Speed: [^\]]+\]", text)
    if speed:
        return speed.group(0), [i for i, line in enumerate(source, start=1)
                                if speed.group(0) in line]
    code = re.fullmatch(r"`((\w+\.)?(\w+)[^`]*)`", text)
    if not code:
        return None
    whole, qualified, name = code.group(1), code.group(2), code.group(3)
    # `name` or `Class.name` of the script; `module.name` is a use of another module's name
    if not qualified or any(re.match(rf"class {qualified[:-1]}\b", line) for line in source):
        definition = re.compile(rf"\s*(?:def|class) {name}\b")
        lines = [i for i, line in enumerate(source, start=1) if definition.match(line)]
        if lines:  # a name the script defines: the link must land on its definition
            return f"`{name}`", lines
    return f"`{whole}`", [i for i, line in enumerate(source, start=1) if whole in line]


def stale_line_links(files: list[Path], kinds: list[str]) -> list[str]:
    """Problems with links to script lines: past the end of the file, or away from the detail they
    name."""
    problems = []
    for path in files:
        for link in links(path, kinds):
            resolved = local_target(link)
            if resolved is None or resolved[0].suffix != ".py" or not resolved[0].is_file():
                continue
            script, fragment = resolved
            match = LINE_FRAGMENT.match(fragment)
            if not match:
                continue
            where = f"{display(path)}:{link['line']}"
            first = int(match.group(1))
            last = int(match.group(2) or first)
            length = len(script.read_text().splitlines())
            if last > length:
                problems.append(f"{where}: {link['target']} is past the end of {script.name} "
                                f"({length} lines)")
                continue
            # A link that names no detail must name what it points at, and land on it.
            named = None if link["markers"] else named_line(script, link["text"])
            if not link["markers"] and named is None:
                problems.append(f"{where}: {link['target']} names nothing its line can be checked "
                                f"against ({link['text']!r}): name the detail, marker or code")
            elif named is not None and not any(first <= line <= last for line in named[1]):
                problems.append(f"{where}: {link['target']} names {named[0]}, which {script.name} "
                                f"has on line(s) {', '.join(map(str, named[1])) or 'none'}")
            for kind, number in link["markers"]:
                lines = marker_lines(script, kind, number)
                if not lines:
                    problems.append(f"{where}: {link['target']} names [{kind} {number}], which "
                                    f"{script.name} does not mark")
                elif not any(first - MARKER_WINDOW <= line <= last + MARKER_WINDOW
                             for line in lines):
                    problems.append(f"{where}: {link['target']} names [{kind} {number}], but "
                                    f"{script.name} marks it on line(s) "
                                    f"{', '.join(map(str, lines))}")
    return problems


def test_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=HUNG_AFTER)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmark" / "index.html").is_file()


def test_every_relative_link_resolves():
    kinds = detail_kinds()
    broken = []
    checked = 0
    for path in markdown_files():
        for link in links(path, kinds):
            resolved = local_target(link)
            if resolved is None:
                continue
            checked += 1
            if not resolved[0].exists():
                broken.append(f"{display(path)}:{link['line']}: {link['target']}")
    assert checked > 0
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_links_of_one_line_point_at_different_lines():
    """A table row that links one detail twice names two places (Core 12: the loss that computes the
    debug variables, and the loop that logs them); two of its links on one script line, as a
    renumbering that sends both to the first marker leaves them, name one place twice."""
    kinds = detail_kinds()
    problems = []
    for path in markdown_files():
        targets_by_line = {}
        for link in links(path, kinds):
            if "#L" in link["target"]:
                targets_by_line.setdefault(link["line"], []).append(link["target"])
        for line, targets in targets_by_line.items():
            problems += [f"{display(path)}:{line}: {target} twice"
                         for target in sorted(set(targets)) if targets.count(target) > 1]
    assert not problems, "\n".join(problems)


def test_script_line_links_point_at_the_details_they_name():
    problems = stale_line_links(markdown_files(), detail_kinds())
    assert not problems, ("stale links to script lines (update the line numbers):\n"
                          + "\n".join(problems))


def test_line_link_check_catches_stale_links(tmp_path):
    """The checker itself: a link that names a detail passes on its marker and fails elsewhere,
    whether the detail is named in the link text, in the table row, or by the row's number."""
    (tmp_path / "ppo").mkdir()
    (tmp_path / "docs").mkdir()
    script_lines = ["x = 1"] * 30
    script_lines[0] = '"""The details are marked: `[Core 5: GAE]` for one."""'  # line 1: an index
    script_lines[9] = "# [Core 5: Generalized Advantage Estimation]"  # line 10
    script_lines[19] = "# [Atari 2: MaxAndSkipEnv]"  # line 20
    script_lines[4] = "# [Speed: torch.compile] compiled"  # line 5
    script_lines[14] = "def evaluate(args):"  # line 15
    script_lines[15] = "    return args"
    script_lines[23] = "def train(args):"
    script_lines[24] = "    step = speed.compiled(args)"  # line 25
    (tmp_path / "ppo" / "demo.py").write_text("\n".join(script_lines) + "\n")
    page = tmp_path / "docs" / "demo.md"
    page.write_text("\n".join([
        "[`[Core 5: GAE]`](../ppo/demo.py#L10)",                       # ok: on the marker
        "[Core 5](../ppo/demo.py#L20)",                                # stale
        "| Atari 2 | frame skip | [here](../ppo/demo.py#L19-L21) |",   # ok: the row names it
        "| Atari 2 | frame skip | [here](../ppo/demo.py#L2) |",        # stale
        "## The core details",
        "Each carries a `[Core N: ...]` comment.",
        "| 5 | GAE | [gae](../ppo/demo.py#L9) |",                      # stale: one line off
        # ok: row number in a Core table
        "| 5 | GAE | [gae](../ppo/demo.py#L10) |",
        "| 5 | GAE | [gae](../ppo/demo.py#L25) |",                     # stale
        "[Core 7](../ppo/demo.py#L10)",                                # not marked in the script
        "[plain](../ppo/demo.py#L99)",                                 # past the end
        "[`[Speed: torch.compile]`](../ppo/demo.py#L5)",               # ok: on the marker
        "[`[Speed: torch.compile]`](../ppo/demo.py#L6)",               # stale
        "[`evaluate`](../ppo/demo.py#L15)",                            # ok: on its definition
        "[`evaluate`](../ppo/demo.py#L16)",                            # stale
        "[here](../ppo/demo.py#L15)",                                  # names nothing
        "[`speed.compiled`](../ppo/demo.py#L25)",                   # ok: on its use
        "[`speed.compiled`](../ppo/demo.py#L24)",                   # stale
        "[`frameskip=1`](../ppo/demo.py#L25)",                         # stale: not on that line
        "```",
        "[Core 5](../ppo/demo.py#L1)",                                 # in a code block: ignored
        "```",
        # stale: the docstring's index
        "| 5 | GAE | [gae](../ppo/demo.py#L1) |",
    ]) + "\n")
    problems = stale_line_links([page], list(DETAIL_KINDS))
    flagged = sorted(int(problem.split(":")[1]) for problem in problems)
    assert flagged == [2, 4, 7, 9, 10, 11, 13, 15, 16, 18, 19, 23], problems


def test_index_links_every_variant_page():
    index = (REPO / "docs" / "index.md").read_text()
    pages = sorted(path.name for path in (REPO / "docs").glob("ppo*.md"))
    assert "ppo.md" in pages
    missing = [page for page in pages if f"]({page})" not in index]
    assert not missing, f"docs/index.md does not link {missing}"


def test_every_page_is_in_the_nav():
    config = (REPO / "mkdocs.yml").read_text()
    in_nav = set(re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", config, re.MULTILINE))
    pages = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").glob("**/*.md")}
    assert pages <= in_nav, f"pages missing from the nav of mkdocs.yml: {sorted(pages - in_nav)}"


def test_docs_cite_nothing_outside_the_repository():
    """A user's clone has the repository's tracked files and nothing beside them: every relative
    path a page names, in a link or in code, must be one of them (docs/ once cited
    `../shared/FACTS.md`, a file of the machine the project was built on)."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                                 text=True).stdout.split())
    outside = []
    for path in markdown_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for target in re.findall(r"(?:\]\(|`)((?:\.\./)+[^)`\s]*)", line):
                resolved = (path.parent / unquote(target.split("#")[0])).resolve()
                inside = resolved.is_relative_to(REPO) and (
                    str(resolved.relative_to(REPO)) in tracked or resolved.is_dir()
                    or not resolved.suffix)
                if not inside:
                    outside.append(f"{display(path)}:{number}: {target}")
    assert not outside, "paths outside the repository:\n" + "\n".join(outside)


def test_every_test_the_docs_name_exists():
    """The docs cite tests as evidence (`tests/test_ppo.py::test_...`, or `test_...` alone beside
    such a path): a renamed test leaves the reader looking for something that is not there."""
    defined = {path.name: set(re.findall(r"^def (test_\w+)\(", path.read_text(), re.MULTILINE))
               for path in (REPO / "tests").glob("test_*.py")}
    everywhere = set().union(*defined.values())
    missing = []
    for page in [*markdown_files(), REPO / "CONTRIBUTING.md"]:
        text = page.read_text()
        for file, name in re.findall(r"tests/(test_\w+\.py)::(test_\w+)", text):
            if name not in defined.get(file, ()):
                missing.append(f"{page.relative_to(REPO)}: tests/{file}::{name}")
        for name in re.findall(r"`(test_\w+)`", text):
            if name not in everywhere:
                missing.append(f"{page.relative_to(REPO)}: {name}")
    assert not missing, missing


# The user pages teach; measurements, experiments and histories go to the notes (docs/notes/).
SCRIPT_PAGE_WORDS = 1_500
USER_PAGES_WORDS = 16_000  # 12,000 until "Your own environment" (issue 37), 13,000 until the eighth
# script's page and its results (ppo_multidiscrete.py, issue 47) joined the pages, 15,000 until a
# trained agent's path (--watch, --export: issue 71) joined getting_started.md and each script's
# page


def test_user_pages_stay_short_and_the_notes_come_last():
    """Each script page within SCRIPT_PAGE_WORDS, all pages outside docs/notes/ together within
    USER_PAGES_WORDS (`wc -w`), and the notes in one section at the end of the nav."""
    words = {path.relative_to(REPO / "docs").as_posix(): len(path.read_text().split())
             for path in (REPO / "docs").glob("**/*.md")
             if "notes" not in path.relative_to(REPO / "docs").parts}
    long_pages = {page: count for page, count in words.items()
                  if page.startswith("ppo") and count > SCRIPT_PAGE_WORDS}
    assert not long_pages, f"script pages over {SCRIPT_PAGE_WORDS} words: {long_pages}"
    assert sum(words.values()) <= USER_PAGES_WORDS, (
        f"the user pages hold {sum(words.values())} words, over {USER_PAGES_WORDS}: move lab notes "
        "to docs/notes/")
    config = (REPO / "mkdocs.yml").read_text()
    nav = config.split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    top = [line for line in nav.splitlines() if re.match(r"^  - ", line)]
    assert top[-1].strip() == "- Notes:", top[-1]
    assert all("notes/" not in line for line in nav.split("- Notes:")[0].splitlines())


# Phrases that speak of how the project was made, not to its readers: the machines it was built on,
# its working sessions, files only those machines hold. The docs name the hardware a figure was
# measured on ("a 2-core AMD EPYC VM") and cite public sources instead.
PRIVATE_WORDING = re.compile(
    r"\b(?:this machine|reference machine|this VM|(?:earlier|previous|this|a) session|lent)\b"
    r"|\bshared/|\bseeds/\S*\.txt", re.IGNORECASE)


def test_pages_speak_to_readers_not_of_the_project_s_own_machines():
    found = []
    for page in [*markdown_files(), REPO / "CONTRIBUTING.md"]:
        text = " ".join(page.read_text().split())  # a phrase may break across lines
        for match in PRIVATE_WORDING.finditer(text):
            found.append(f"{page.relative_to(REPO)}: {match.group(0)!r} in "
                         f"...{text[max(0, match.start() - 50):match.end() + 50]}...")
    assert not found, ("pages that speak of the project's own machines or sessions:\n"
                       + "\n".join(found))
