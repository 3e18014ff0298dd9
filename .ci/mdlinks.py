#!/usr/bin/env python3
"""The Markdown docs hold together: every relative link reaches a file, every `#anchor` a
heading of it (GitHub's slugs), and no table is cut by a paragraph (a row after a text line
with no header under it prints as text).

    python3 .ci/mdlinks.py        # every tracked *.md; exit 1 on any finding
"""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def tracked():
    out = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    # The fuzz corpora and vendored trees hold no docs of ours.
    return [f for f in out.split() if "/corpus/" not in f]


def prose(text):
    """The lines outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (`-` and `_` kept),
    spaces to `-`; markup's backticks and link brackets go with the punctuation."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    heading = re.sub(r"[^\w\- ]", "", heading.lower())
    return heading.replace(" ", "-")


def anchors(text):
    seen, found = {}, set()
    for _, line in prose(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', line))
    return found


def main():
    files = tracked()
    texts = {f: open(os.path.join(ROOT, f), encoding="utf-8").read() for f in files}
    heads = {f: anchors(t) for f, t in texts.items()}
    bad = []
    for f, text in texts.items():
        lines = list(prose(text))
        for i, (number, line) in enumerate(lines):
            for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                path, _, frag = target.partition("#")
                to = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                if not os.path.exists(os.path.join(ROOT, to)):
                    bad.append(f"{f}:{number}: no file {target}")
                elif frag and to.endswith(".md") and frag not in heads.get(to, set()):
                    bad.append(f"{f}:{number}: no heading #{frag} in {to}")
            before = lines[i - 1][1] if i > 0 else ""
            after = lines[i + 1][1] if i + 1 < len(lines) else ""
            if (
                line.startswith("|")
                and before.strip()
                and not before.startswith("|")
                and not re.match(r"^\|\s*:?-", after)
            ):
                bad.append(f"{f}:{number}: a table row after text, with no header: {line[:60]}")
    for b in bad:
        print(b)
    print(f"mdlinks: {len(files)} files, {len(bad)} findings")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
