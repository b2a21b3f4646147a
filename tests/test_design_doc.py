"""Every citation of docs/DESIGN.md in the repository names a section that exists.

A citation is the document's name followed by a section sign and a number (§3, §3.3), or by a
quoted section title; a section is a numbered heading of the document ("## 3. Training methods",
"### 3.3 Fast-BAT"). Every .py and .md file is read, results/ and generated directories aside,
and so are the document's own cross-references (a bare §N inside it). Plain text only: no
TensorFlow, no git.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "DESIGN.md")
# Sweep results, run directories and tool output: not the project's prose or code.
SKIPPED_DIRS = {"results", "runs", "build", "__pycache__"}

HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s+(\S.*?)\s*$")
# The document's name, then either § and a number or a quoted title; `sign` catches a § (or the
# word "section") that is not followed by a number.
CITATION = re.compile(
    r"DESIGN\.md"
    r"(?:[\s,:;#(]*(?:§|[Ss]ection\s)\s*(?P<number>\d+(?:\.\d+)*)"
    r"|[\s,(]+\"(?P<title>[^\"\n]+)\""
    r"|[\s,:;#(]*(?P<sign>§|[Ss]ection\b))?"
)
CROSS_REFERENCE = re.compile(r"§\s*(\d+(?:\.\d+)*)")


def sections(text: str) -> dict[str, str]:
    """Section number -> title, from the document's numbered headings."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = HEADING.match(line)
        if match:
            number, title = match.groups()
            assert number not in found, f"DESIGN.md numbers two sections {number}"
            found[number] = title
    return found


def unresolved(text: str, known: dict[str, str], where: str) -> list[str]:
    """'<where>:<line>: ...' for each citation in `text` that names no section in `known`."""
    titles = {title.casefold() for title in known.values()}
    bad = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        cited = match.group(0).strip()
        if match["number"] and match["number"] not in known:
            bad.append(f"{where}:{line}: {cited!r}: DESIGN.md has no section {match['number']}")
        elif match["title"] and match["title"].casefold() not in titles:
            bad.append(f"{where}:{line}: {cited!r}: DESIGN.md has no section of that title")
        elif match["sign"]:
            bad.append(f"{where}:{line}: {cited!r}: a section sign without a section number")
    return bad


def unresolved_cross_references(text: str, known: dict[str, str], where: str) -> list[str]:
    return [
        f"{where}:{text.count(chr(10), 0, match.start()) + 1}: §{match[1]}: no such section"
        for match in CROSS_REFERENCE.finditer(text)
        if match[1] not in known
    ]


def citing_files() -> list[str]:
    """The repository's .py and .md files, outside results/ and hidden or generated folders."""

    def wanted(top: str, name: str) -> bool:
        if name.startswith(".") or name.endswith(".egg-info"):
            return False
        # results/ holds sweep output; bench/results/ is the project's own.
        return name not in SKIPPED_DIRS or (name == "results" and top != ROOT)

    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if wanted(top, d))
        found += [os.path.join(top, name) for name in files if name.endswith((".py", ".md"))]
    return sorted(found)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_document_has_numbered_sections():
    known = sections(read(DOC))
    assert {"1", "2", "3", "4", "5", "6", "7"} <= set(known), sorted(known)


def test_every_citation_names_an_existing_section():
    known = sections(read(DOC))
    bad = []
    for path in citing_files():
        bad += unresolved(read(path), known, os.path.relpath(path, ROOT))
    bad += unresolved_cross_references(read(DOC), known, os.path.relpath(DOC, ROOT))
    assert not bad, "citations of sections DESIGN.md does not have:\n" + "\n".join(bad)


def test_the_check_reports_a_bad_citation_with_its_file_and_line():
    """On made-up text (the name is split here so that this file cites nothing itself)."""
    name = "DESIGN" + ".md"
    known = sections("## 1. Layout\n### 1.1 Layers\n## 2. Conventions\n")
    text = (
        f'fine: {name} §1, {name} §1.1, ({name} §2, P_C), docs/{name}, {name}, "Layout".\n'
        f"# also fine:\n# see {name}\n# §2\n"
        f"bad: {name} §9 and {name} §1.2\n"
        f'bad: {name}, "Evaluation"\n'
        f"bad: {name} §, and {name} section three\n"
    )
    assert unresolved(text, known, "x.py") == [
        f"x.py:5: '{name} §9': DESIGN.md has no section 9",
        f"x.py:5: '{name} §1.2': DESIGN.md has no section 1.2",
        f"x.py:6: '{name}, \"Evaluation\"': DESIGN.md has no section of that title",
        f"x.py:7: '{name} §': a section sign without a section number",
        f"x.py:7: '{name} section': a section sign without a section number",
    ]
    assert unresolved_cross_references("see §1.1 and §3\n", known, "d.md") == [
        "d.md:1: §3: no such section"
    ]
