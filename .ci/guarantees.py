#!/usr/bin/env python3
"""Checks docs/GUARANTEES.md against the tests that pin it.

A guarantee is defined by a heading `### G<n> <title>` (or a bold label `**G<n>**`), optionally
after its anchor `<a id="g<n>"></a>`; a test names it by the token `G<n>` in a comment
(`// Pins G7.`, or `(G7)` in its doc comment). Fails (exit 1, listing why) when:
  * the numbers defined are not exactly G1..Gmax, each once, in order (a gap, a duplicate),
    or a guarantee's anchor is not `g<n>`;
  * a guarantee (not marked "(withdrawn)" in its heading) is named by no file
    scanned;
  * a file scanned names a guarantee the document does not define;
  * a relative link of the document points to no file (unless its paragraph says the file is
    planned: "issue #<n>"), or a test a guarantee's "Tests:" paragraph lists after a link (a
    `snake_case` name in backquotes) does not occur in that file.
Files scanned, comments only (`//` in Rust, `#` elsewhere): tests/, src/, tower/, server/tests/,
server/src/, examples/pingora/, fuzz/fuzz_targets/, fuzz/src/, benches/ (`*.rs`), and .ci/*.
Without -q it also prints the planned files and, as notes, each test the document lists under a
guarantee whose own comments (the block right above it, or its line; for a file listed without
tests, the whole file) do not name that guarantee. -q prints nothing on success.
Usage: python3 .ci/guarantees.py [-q]"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
DOC = os.path.join(ROOT, 'docs', 'GUARANTEES.md')
SELF = os.path.abspath(__file__)
RUST_TREES = ['tests', 'src', 'tower', 'server/tests', 'server/src', 'examples/pingora',
              'fuzz/fuzz_targets', 'fuzz/src', 'benches']
SKIP_DIRS = {'target', '.git', 'corpus', 'artifacts', 'node_modules'}
TOKEN = re.compile(r'\bG(\d+)\b')
ANCHOR = r'(?:<a\s+(?:id|name)="([^"]*)"\s*>\s*</a>\s*)?'
HEADING = re.compile(r'^#{2,6}\s+' + ANCHOR + r'G(\d+)\b(.*)$')
BOLD = re.compile(r'^\s*(?:[-*+]\s+)?' + ANCHOR + r'\*\*G(\d+)\b(.*)$')
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
NAME = re.compile(r'`([a-z][a-z0-9_]*)`')
PLANNED = re.compile(r'issue #\d+')


def rel(path):
    return os.path.relpath(path, ROOT)


def parse_doc(text):
    """(definitions [(n, line, withdrawn, anchor)], paragraphs [(first line, text, guarantee)])."""
    defs, paras, cur, fence = [], [], None, False
    block, start = [], 0
    for i, line in enumerate(text.split('\n'), 1):
        if line.lstrip().startswith('```'):
            fence = not fence
        if fence:
            continue
        m = HEADING.match(line) or BOLD.match(line)
        if m:
            cur = int(m.group(2))
            # Withdrawn: no test needs to name it.
            title = m.group(3).lower()
            defs.append((cur, i, 'withdrawn' in title, m.group(1)))
        elif line.startswith('#'):
            cur = None  # a heading that is no guarantee ends the last one
        if line.strip():
            if not block:
                start = i
            block.append(line)
        elif block:
            paras.append((start, ' '.join(block), cur))
            block = []
    if block:
        paras.append((start, ' '.join(block), cur))
    return defs, paras


def comment_of(line, hash_comments):
    """The comment part of a source line, or ''. Good enough for tags: a `//` (or `#`) that
    starts the line, or follows code outside a string literal."""
    s = line.strip()
    mark = '#' if hash_comments else '//'
    if hash_comments and s.startswith('#!'):
        return ''
    if s.startswith(mark):
        return s
    quoted, i = False, 0
    while i < len(line):
        c = line[i]
        if c == '\\' and quoted:
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif not quoted and line.startswith(mark, i) and (i == 0 or line[i - 1].isspace()):
            return line[i:]
        i += 1
    return ''


def scanned_files():
    for tree in RUST_TREES:
        top = os.path.join(ROOT, tree)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for f in sorted(filenames):
                if f.endswith('.rs'):
                    yield os.path.join(dirpath, f), False
    ci = os.path.join(ROOT, '.ci')
    for f in sorted(os.listdir(ci)):
        path = os.path.join(ci, f)
        if os.path.isfile(path) and os.path.abspath(path) != SELF:
            yield path, True


def read(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        return f.read()


def names_near(lines, name, hash_comments):
    """The guarantee numbers in the comments that introduce `name` in a file: its line's own
    comment and the block of comment and attribute lines right above it. None if `name` is
    not found."""
    at = None
    fn = re.compile(r'\bfn\s+' + re.escape(name) + r'\b')
    word = re.compile(r'\b' + re.escape(name) + r'\b')
    for i, line in enumerate(lines):
        if fn.search(line):
            at = i
            break
    if at is None:
        for i, line in enumerate(lines):
            if word.search(line) and not line.strip().startswith('#' if hash_comments else '//'):
                at = i
                break
    if at is None:
        return None
    found = set(int(n) for n in TOKEN.findall(comment_of(lines[at], hash_comments)))
    i = at - 1
    while i >= 0:
        s = lines[i].strip()
        if s.startswith('//') or s.startswith('#[') or s.startswith('#!['):
            found |= set(int(n) for n in TOKEN.findall(comment_of(lines[i], hash_comments)))
            i -= 1
        else:
            break
    return found


def main():
    quiet = '-q' in sys.argv[1:]
    errors, notes, pending = [], [], []
    text = read(DOC)
    defs, paras = parse_doc(text)
    doc = rel(DOC)

    # Numbering: exactly 1..max, each once, in order.
    numbers = [n for n, _, _, _ in defs]
    if not defs:
        errors.append(f'{doc}: no guarantee defined (headings "### G<n> <title>")')
    seen = {}
    for n, line, _, anchor in defs:
        if anchor is not None and anchor != f'g{n}':
            errors.append(f'{doc}:{line}: G{n}\'s anchor is "{anchor}", not "g{n}"')
        if n in seen:
            errors.append(f'{doc}:{line}: G{n} defined twice (first at line {seen[n]})')
        else:
            seen[n] = line
    for n in range(1, max(numbers, default=0) + 1):
        if n not in seen:
            errors.append(f'{doc}: G{n} missing: the numbers have a gap')
    for (a, _, _, _), (b, line, _, _) in zip(defs, defs[1:]):
        if b < a:
            errors.append(f'{doc}:{line}: G{b} after G{a}: out of order')
    withdrawn = {n for n, _, w, _ in defs if w}

    # Links, and the tests each guarantee lists.
    listed = {}  # n -> [(path, name or None)]
    for start, para, g in paras:
        links = list(LINK.finditer(para))
        for k, m in enumerate(links):
            target = m.group(1)
            if re.match(r'^[a-z]+:', target) or target.startswith('#'):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(DOC), target.split('#')[0]))
            end = links[k + 1].start() if k + 1 < len(links) else len(para)
            names = NAME.findall(para[m.end():end])
            if not os.path.exists(path):
                if PLANNED.search(para):
                    pending.append(f'{doc}:{start}: {rel(path)} (planned: '
                                   f'{PLANNED.search(para).group(0)})')
                else:
                    errors.append(f'{doc}:{start}: link to a missing file: {target}')
                continue
            if g is None or not para.startswith('Tests:'):
                continue
            src = read(path) if os.path.isfile(path) else ''
            for name in names:
                if not re.search(r'\b' + re.escape(name) + r'\b', src):
                    errors.append(f'{doc}:{start}: G{g} lists `{name}`, '
                                  f'which {rel(path)} does not contain')
                listed.setdefault(g, []).append((path, name))
            if not names:
                listed.setdefault(g, []).append((path, None))

    # The tags in the sources.
    named = {}  # n -> set of files
    lines_of = {}
    for path, hash_comments in scanned_files():
        lines = read(path).split('\n')
        lines_of[os.path.abspath(path)] = (lines, hash_comments)
        for i, line in enumerate(lines, 1):
            for n in TOKEN.findall(comment_of(line, hash_comments)):
                n = int(n)
                named.setdefault(n, set()).add(rel(path))
                if n not in seen:
                    errors.append(f'{rel(path)}:{i}: names G{n}, which {doc} does not define')
    for n in sorted(seen):
        if n not in named and n not in withdrawn:
            errors.append(f'G{n} is named by no test (add "// Pins G{n}." to a test that '
                          f'pins it)')

    # Notes: listed tests that do not name their guarantee where they stand.
    for n in sorted(listed):
        for path, name in listed[n]:
            key = os.path.abspath(path)
            if key not in lines_of:
                continue
            lines, hash_comments = lines_of[key]
            if name is None:
                ok = rel(path) in named.get(n, set())
                where = rel(path)
            else:
                near = names_near(lines, name, hash_comments)
                ok = near is not None and n in near
                where = f'{rel(path)}: {name}'
            if not ok:
                notes.append(f'{where} -> G{n}')

    if errors:
        for e in errors:
            print(e)
        print(f'guarantees: {len(errors)} error(s)')
    if not quiet:
        if pending:
            print('planned files the document links to (not yet there):')
            for p in pending:
                print('  ' + p)
        if notes:
            print('tests listed under a guarantee whose comments do not name it:')
            notes_by = {}
            for note in notes:
                where, g = note.rsplit(' -> ', 1)
                notes_by.setdefault(where, []).append(g)
            for where in sorted(notes_by):
                print(f'  {where} -> {", ".join(notes_by[where])}')
        if not errors:
            files = len(set().union(*named.values())) if named else 0
            print(f'guarantees: G1..G{max(numbers)} defined, each named by a test '
                  f'({files} files)')
    sys.exit(1 if errors else 0)


if __name__ == '__main__':
    main()
