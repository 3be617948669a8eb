#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown files.

Usage: python3 hack/check-links.py [--root DIR] [--self-test]

Every Markdown file git knows (tracked, or new and not ignored) is read, and
each relative link in it is checked: an inline link or image
`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, and a reference
definition `[label]: path`. The file (or directory) a link names must be in
the repository, and an anchor into a Markdown file must be one of its
headings as GitHub makes them (or an explicit `<a name=...>` / `id=...`).
An anchor into any other file (`src/lib.rs#L10`) needs only the file.
Links to other sites (http, https, mailto, any scheme) are not followed,
and nothing inside fenced code blocks or inline code is a link.

Prints one line per broken link, `FILE:LINE: TARGET: REASON`, and exits 1 if
there was any (2 on a usage error). `--self-test` first checks the checker
on a small tree of its own with known broken links, so that a checker that
finds nothing cannot pass silently. Python's standard library only: CI and a
fresh machine need nothing installed.
"""

import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from urllib.parse import unquote

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# [text](target "title") and ![alt](target): the text may hold one level of
# brackets (`[a [b] c](x)`), the target may be <wrapped>.
INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<[A-Za-z][^>]*?\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def strip_inline_code(line):
    """The line with every inline code span blanked (same length, so that
    nothing in `[x](y)` written as code counts as a link)."""
    out = []
    i = 0
    while i < len(line):
        if line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            ticks = line[i:j]
            end = line.find(ticks, j)
            # A run of backticks with no closing run of the same length is
            # literal text, as CommonMark reads it.
            while end != -1 and end + len(ticks) < len(line) and line[end + len(ticks)] == "`":
                end = line.find(ticks, end + len(ticks) + 1)
            if end == -1:
                out.append(ticks)
                i = j
                continue
            out.append(" " * (end + len(ticks) - i))
            i = end + len(ticks)
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def prose_lines(text):
    """(line number, line) for each line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
            fence = None


def heading_text(raw):
    """A heading as GitHub renders its text: code spans, links and images
    reduced to their text, HTML tags dropped."""
    raw = re.sub(r"[ \t]+#+[ \t]*$", "", raw)  # closing hashes
    raw = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", raw)
    raw = re.sub(r"<[^>]+>", "", raw)
    return raw.replace("`", "")


def slug(text):
    """GitHub's anchor for a heading's text: lower case, every character but
    letters, digits, spaces, hyphens and underscores dropped, each space a
    hyphen."""
    kept = []
    for c in text.strip().lower():
        if c in " -_" or c.isalnum() or unicodedata.category(c) in ("Mn", "Mc"):
            kept.append(c)
    return "".join(kept).replace(" ", "-")


def anchors(text):
    """Every anchor a Markdown file offers: its headings' slugs (a repeated
    one gets -1, -2, ... as GitHub numbers them) and explicit HTML ones."""
    found = set()
    seen = {}
    previous = ""
    for _, line in prose_lines(text):
        title = None
        m = ATX.match(line)
        if m:
            title = m.group(2) or ""
        elif SETEXT.match(line) and previous.strip() and not ATX.match(previous) and not previous.lstrip().startswith(("|", "-", "*", ">")):
            title = previous.strip()
        if title is not None:
            base = slug(heading_text(title))
            name = base
            n = seen.get(base, 0)
            while name in found:
                n += 1
                name = f"{base}-{n}"
            seen[base] = n
            found.add(name)
        for a in HTML_ANCHOR.findall(line):
            found.add(a)
        previous = line
    return found


def links(text):
    """(line number, target) for every link in a Markdown file's prose."""
    for number, line in prose_lines(text):
        plain = strip_inline_code(line)
        m = REFDEF.match(plain)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE.finditer(plain):
            yield number, m.group(1)


def check(root, files):
    """Broken links as (file, line, target, reason), over the Markdown files
    among `files` (paths relative to `root`, '/'-separated), each link's
    file looked for among `files` and their directories."""
    files = set(files)
    dirs = {""}
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    cache = {}

    def anchors_of(path):
        if path not in cache:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    broken = []
    for md in sorted(f for f in files if f.endswith(".md")):
        with open(os.path.join(root, md), encoding="utf-8") as f:
            text = f.read()
        for number, target in links(text):
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if not target or SCHEME.match(target):
                continue
            path, _, fragment = target.partition("#")
            path = unquote(path.split("?", 1)[0])
            if path:
                if path.startswith("/"):
                    resolved = os.path.normpath(path.lstrip("/"))
                else:
                    resolved = os.path.normpath(os.path.join(os.path.dirname(md), path))
                resolved = resolved.replace(os.sep, "/")
                if resolved == ".":
                    resolved = ""
                if resolved.startswith("../"):
                    broken.append((md, number, target, "outside the repository"))
                    continue
                if resolved not in files and resolved not in dirs:
                    broken.append((md, number, target, "no such file"))
                    continue
            else:
                resolved = md
            if fragment and resolved in files and resolved.endswith(".md"):
                if unquote(fragment) not in anchors_of(resolved):
                    broken.append((md, number, target, f"no heading or anchor '{fragment}' in {resolved}"))
    return broken


def repository_files(root):
    """Files git tracks, and new files it does not ignore, still on disk."""
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        stdout=subprocess.PIPE,
    ).stdout.decode()
    return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))]


def self_test():
    """The checker on a tree with one good and three broken links (a file
    that does not exist, an anchor that does not, and a link to a missing
    file's anchor), besides links it must not follow or must accept."""
    tree = {
        "README.md": "\n".join(
            [
                "# Title",
                "## A `code` heading: with punctuation!",
                "## Repeated",
                "## Repeated",
                '<a name="explicit"></a>',
                "[good file](docs/guide.md)",
                "[good anchor](docs/guide.md#how-it-works)",
                "[own heading](#a-code-heading-with-punctuation)",
                "[second repeated](#repeated-1)",
                "[explicit](#explicit)",
                "[directory](docs)",
                "[code line](src/main.rs#L3)",
                "[web](https://example.com/missing.md)",
                "`[in code](missing-in-code.md)`",
                "```",
                "[in a fence](missing-in-fence.md)",
                "```",
                "[broken file](docs/missing.md)",
                "[broken anchor](docs/guide.md#no-such-heading)",
                "[ref]: docs/guide.md#also-missing",
                "",
            ]
        ),
        "docs/guide.md": "# Guide\n\n## How it works\n\n[back](../README.md#repeated)\n",
        "src/main.rs": "fn main() {}\n",
    }
    expected = [
        ("README.md", 18, "docs/missing.md"),
        ("README.md", 19, "docs/guide.md#no-such-heading"),
        ("README.md", 20, "docs/guide.md#also-missing"),
    ]
    with tempfile.TemporaryDirectory() as root:
        for path, text in tree.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        got = [(f, n, t) for f, n, t, _ in check(root, tree)]
    if got != expected:
        print(f"check-links: self-test FAILED: flagged {got}, expected {expected}", file=sys.stderr)
        return False
    print(f"check-links: self-test passed ({len(expected)} broken links flagged, no others)")
    return True


def main(argv):
    root = None
    test = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--self-test":
            test = True
        elif a == "--root" and args:
            root = args.pop(0)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            print(f"check-links: unknown argument {a} (see --help)", file=sys.stderr)
            return 2
    if test:
        return 0 if self_test() else 1
    if root is None:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.abspath(root)
    files = repository_files(root)
    broken = check(root, files)
    for md, number, target, reason in broken:
        print(f"{md}:{number}: {target}: {reason}")
    checked = sum(1 for f in files if f.endswith(".md"))
    if broken:
        print(f"check-links: {len(broken)} broken links in {checked} Markdown files", file=sys.stderr)
        return 1
    print(f"check-links: every relative link in {checked} Markdown files resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
