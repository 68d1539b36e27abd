"""What the tests that scan the source tree share (host_reads_test.py, layers_test.py,
structure_test.py, pitfalls_test.py, version_tests_test.py): the --source argument; a self-check
that plants each breach of each rule in a fresh scratch copy of the folders the scan reads and
must find exactly that breach, so that no rule passes by accident; then the scan of the tree."""
import argparse
import glob
import os
import shutil
import sys
import tempfile


class PlantError(Exception):
    """A breach that could not be planted: the file or text it changes is not in the tree."""


def _files(root, pattern):
    found = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    if not found:
        raise PlantError(f"{pattern} matches nothing")
    return found


def _write(path, text):
    """`text` written to `path` as a new file: a plant's copy shares its files with the scratch
    tree it was linked from (planted()), so no edit may write into an existing file."""
    if os.path.lexists(path):
        os.remove(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _read(root, rel):
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        raise PlantError(f"{rel} is missing")
    return open(path, encoding="utf-8").read()


def append(rel, text):
    """An edit: `text` and a newline appended to the file `rel`, which must exist."""
    def do(root):
        _write(os.path.join(root, rel), _read(root, rel) + text + "\n")
    return do


def create(rel, text):
    """An edit: a new file `rel` holding `text`."""
    def do(root):
        path = os.path.join(root, rel)
        if os.path.exists(path):
            raise PlantError(f"{rel} exists already")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write(path, text)
    return do


def remove(pattern):
    """An edit: every file or folder the glob `pattern` matches (at least one) removed."""
    def do(root):
        for path in _files(root, pattern):
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    return do


def replace(pattern, old, new):
    """An edit: every `old` in the files the glob `pattern` matches becomes `new`; at least one
    must."""
    def do(root):
        hits = 0
        for path in _files(root, pattern):
            text = open(path, encoding="utf-8").read()
            if old in text:
                hits += 1
                _write(path, text.replace(old, new))
        if not hits:
            raise PlantError(f"no {old!r} in {pattern}")
    return do


def edit(rel, change):
    """An edit: the file `rel` rewritten as change(text), which must differ from text (a
    change that finds nothing to change raises PlantError itself or returns text unchanged)."""
    def do(root):
        text = _read(root, rel)
        changed = change(text)
        if changed == text:
            raise PlantError(f"the edit of {rel} changed nothing")
        _write(os.path.join(root, rel), changed)
    return do


def copy_tree(source, scratch, tops):
    """The folders and files `tops` (relative; those missing are left missing) of `source`
    copied under `scratch`."""
    for top in tops:
        src, dst = os.path.join(source, top), os.path.join(scratch, top)
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif os.path.isfile(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)


def missing(root, paths, checker):
    """A finding for each of `paths` (relative files, folders or globs) with nothing under `root`:
    a rule of `checker` reads it, and would check nothing once it moved."""
    return [f"{p}: missing, though {checker} checks it (if it moved, change its path in {checker} too)"
            for p in paths if not glob.glob(os.path.join(root, p))]


def planted(source, violations, tops, plants, tree):
    """(problems, lines): each plant = (what it breaks, edit or list of edits, text the one new
    finding must contain, or None where the edit must add no finding) made alone in a fresh copy
    of `tops` (hard links to one scratch copy, so the edits above replace files, never write into
    them); a problem for each plant whose findings differ from that, and for a copy that does
    not scan as `source` does (`tree`, its findings: `tops` then misses something the scan
    reads)."""
    problems, lines = [], []
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = os.path.join(scratch, "base")
        copy_tree(source, base_dir, tops)
        base = violations(base_dir)
        if sorted(base) != sorted(tree):
            problems.append(f"a copy of {', '.join(tops)} scans otherwise than the tree (a folder the scan reads "
                            f"is not copied, or the tree changed meanwhile): copy {base}, tree {tree}")
        for i, (label, edits, expect) in enumerate(plants):
            root = os.path.join(scratch, str(i))
            shutil.copytree(base_dir, root, symlinks=True, copy_function=os.link)
            try:
                for e in edits if isinstance(edits, list) else [edits]:
                    e(root)
            except PlantError as e:
                problems.append(f"could not plant {label}: {e}")
                continue
            new = [f for f in violations(root) if f not in base]
            if expect is None:
                if new:
                    problems.append(f"{label} must add no finding, but gave {new}")
                else:
                    lines.append(f"{label}: no finding, as it should")
            elif len(new) != 1 or expect not in new[0]:
                problems.append(f"{label} must give one finding saying {expect!r}, but gave {new}")
            else:
                lines.append(f"{label}: {new[0]}")
            shutil.rmtree(root)
    return problems, lines


def run(name, violations, tops, plants, what, ok, self_check=None):
    """`violations(source)` lists the violations under `source`, reading only `tops` (relative
    folders and files); `plants` as planted() takes them; `self_check(source)`, when given,
    checks more and returns a problem or None. `what` heads the list of violations, `ok` the
    line printed when there are none. Prints each planted breach's finding, then exits 1 on a
    failed self-check or any violation, 2 when --source is no folder."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    source = os.path.realpath(ap.parse_args().source)
    if not os.path.isdir(source):
        print(f"{name}: --source {source}: expected the source tree, found no folder", file=sys.stderr)
        sys.exit(2)
    found = violations(source)
    problems, lines = planted(source, violations, tops, plants, found)
    problem = self_check(source) if self_check else None
    problems += [problem] if problem else []
    print(f"{name}: self-check: {len(plants)} plants, each alone in a fresh copy of the tree:")
    for line in lines:
        print("  " + line)
    sys.stdout.flush()
    for p in problems:
        print(f"{name}: self-check failed: {p}", file=sys.stderr)
    if found:
        print(f"{name}: {what}:", file=sys.stderr)
        for f in found:
            print("  " + f, file=sys.stderr)
    if problems or found:
        sys.exit(1)
    print(f"{name}: ok: {ok}")
