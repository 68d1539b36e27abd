#!/usr/bin/python3
"""docs/PITFALLS.md, the catalogue in the project: one row per pitfall ID (D…, M…, T…, X…) with
what crucible does and the tests that fail if it regresses. This fails, naming the ID, the file
and line or the test, when
  - an ID used in src/, include/, tests/, python/, scripts/ or bench/ (a comment, a message, a
    test name's suffix) has no row;
  - a row names a test that does not exist: a TEST/TEST_F/TEST_P/TYPED_TEST in tests/**/*.cpp
    (`Suite.Name`), a `def test_*` in tests/python or tests/scripts (`module.Class.test_name`,
    `file.py::Class::test_name`, or for a function `module.test_name`, `file.py::test_name`), or
    an add_test NAME in tests/CMakeLists.txt;
  - a row without a test (`—`) does not say "not yet", or an ID has two rows;
  - a table of IDs lacks the header, a row has the wrong number of cells;
  - the catalogue, tests/CMakeLists.txt or a scanned folder is missing, or the scan finds no ID
    in use at all (then the first rule would check nothing).

    tests/scripts/pitfalls_test.py [--source DIR]    # exit 0 clean, 1 with the list
Self-checks run first: the ID scan on a sample of the forms it must and must not take; then one
breach of each rule planted in a scratch copy of the tree must be the one new finding
(source_scan.py).
"""
import functools
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

DOC = "docs/PITFALLS.md"
SCANNED = ("src", "include", "tests", "python", "scripts", "bench")
HEADER = ["ID", "what goes wrong in plain PyTorch", "what crucible does", "the test that fails if it regresses"]
NOT_YET = "not yet"
NO_TEST = "—"
CMAKE = "tests/CMakeLists.txt"
TOPS = (*SCANNED, DOC)

# A pitfall ID is a group letter and a number from 1 (no leading zero: "T00" of a timestamp is
# none). It counts in two forms only:
#  - a token of its own, with no letter, digit or underscore on either side: "(T13)", "D11:",
#    "X2/X5", "X6–X8". So "D2D", "X86_64", "F8_E4M3" and "float8_e5m2" are not IDs;
#  - the tail of an identifier, after a lower-case letter or an underscore, possibly several in a
#    row and before a "_CUDA" suffix: TEST names (`…AcrossEpochsD8`, `…ReadBackT5T9`,
#    `…ForTheGpuD9_CUDA`) and Python test names (`test_…_D9`). The identifier starts with a
#    letter or underscore and follows no backslash, so neither the hex literal 0xD8 nor the
#    escape "\xD8" (the JPEG marker) is one; in kF8E5M2 and F8_E4M3 (float8 dtypes) a digit, not
#    a lower-case letter, comes before the letter.
# NOT_IDS: the text of this tree that has an ID's form but is something else, with why; it is
# blanked before the scan.
NOT_IDS = [
    (re.compile(r"\bFF D8 FF\b"), "the JPEG start-of-image bytes (include/crucible/data/image/decode.h)"),
    (re.compile(r"\bmean(?: \(C\))?, M2\b"), "M2 beside a mean: the sum of squared deviations of Chan's parallel "
     "variance (src/nn/batch_norm.cpp)"),
]
ID = r"[DMTX][1-9][0-9]?"
STANDALONE = re.compile(r"(?<![A-Za-z0-9_])(" + ID + r")(?![A-Za-z0-9_])")
IDENTIFIER = re.compile(r"(?<!\\)\b[A-Za-z_][A-Za-z0-9_]*")
TAIL = re.compile(r"(?:(?<=[a-z])|(?<=[a-z]_))((?:" + ID + r")+)(?:_CUDA)?$")
# The examples in this file's self-check are samples of the scan, not uses.
NOT_SCANNED = {"tests/scripts/pitfalls_test.py"}


def ids_in(line):
    """The pitfall IDs a line uses."""
    for pattern, _ in NOT_IDS:
        line = pattern.sub(lambda m: " " * len(m.group(0)), line)
    found = [m.group(1) for m in STANDALONE.finditer(line)]
    for m in IDENTIFIER.finditer(line):
        tail = TAIL.search(m.group(0))
        if tail:
            found += re.findall(ID, tail.group(1))
    return found


def text_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError:
                continue  # not text
            yield path, text


def id_uses(source):
    """{ID: ["file:line", …]} over the scanned folders."""
    uses = {}
    for top in SCANNED:
        for path, text in text_files(os.path.join(source, top)):
            rel = os.path.relpath(path, source)
            if rel in NOT_SCANNED:
                continue
            for line, pid in ids_in_text(text):
                where = f"{rel}:{line}"
                if where not in uses.setdefault(pid, []):
                    uses[pid].append(where)
    return uses


@functools.lru_cache(maxsize=None)
def ids_in_text(text):
    """(line number, ID) of each use in `text` (remembered: the self-check scans many copies)."""
    return tuple((i + 1, pid) for i, line in enumerate(text.split("\n")) for pid in ids_in(line))


def existing_tests(source):
    """Every name a row may give a test by."""
    names = set()
    gtest = re.compile(r"^\s*(?:TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
    for path in glob.glob(os.path.join(source, "tests", "**", "*.cpp"), recursive=True):
        names.update(f"{s}.{n}" for s, n in gtest.findall(open(path, encoding="utf-8").read()))
    for folder in ("python", "scripts"):
        for path in glob.glob(os.path.join(source, "tests", folder, "*.py")):
            module = os.path.basename(path)[:-3]
            cls = None
            for line in open(path, encoding="utf-8").read().split("\n"):
                m = re.match(r"(class|def) (\w+)", line)
                if m:
                    cls = m.group(2) if m.group(1) == "class" else None  # a top-level def ends a class
                    if m.group(1) == "class" or not m.group(2).startswith("test_"):
                        continue
                m = re.match(r"(\s*)def (test_\w+)", line)
                if not m:
                    continue
                if m.group(1) and cls:
                    names.update({f"{module}.{cls}.{m.group(2)}", f"{module}.py::{cls}::{m.group(2)}"})
                elif not m.group(1):
                    names.update({f"{module}.{m.group(2)}", f"{module}.py::{m.group(2)}"})
    cmake = open(os.path.join(source, CMAKE), encoding="utf-8").read()
    names.update(re.findall(r"add_test\s*\(\s*NAME\s+([^\s)]+)", cmake))
    return names


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def rows(doc_text):
    """The catalogue's rows: (line number, ID, what crucible does, test cell), and format errors."""
    found, errors = [], []
    header_ok = False
    for i, line in enumerate(doc_text.split("\n")):
        if not line.lstrip().startswith("|"):
            header_ok = False
            continue
        c = cells(line)
        if c[0] == "ID":
            header_ok = c == HEADER
            if not header_ok:
                errors.append(f"{DOC}:{i + 1}: a table's header is not | {' | '.join(HEADER)} |")
            continue
        if not re.fullmatch(ID, c[0]):
            continue  # the separator row, or a table of another kind
        if not header_ok:
            errors.append(f"{DOC}:{i + 1}: {c[0]} is in a table without the header | {' | '.join(HEADER)} |")
        elif len(c) != len(HEADER):
            errors.append(f"{DOC}:{i + 1}: {c[0]}'s row has {len(c)} cells, not {len(HEADER)}")
        else:
            found.append((i + 1, c[0], c[2], c[3]))
    return found, errors


def violations(source):
    missing = (source_scan.missing(source, [DOC, *SCANNED], "pitfalls_test.py")
               or source_scan.missing(source, [CMAKE], "pitfalls_test.py"))
    if missing:
        return missing  # the other rules need all of them
    doc_text = open(os.path.join(source, DOC), encoding="utf-8").read()
    table, found = rows(doc_text)
    tests = existing_tests(source)
    first = {}
    for line, pid, does, test_cell in table:
        if pid in first:
            found.append(f"{DOC}:{line}: {pid} has a second row (the first is at line {first[pid]})")
            continue
        first[pid] = line
        if test_cell == NO_TEST:
            if NOT_YET not in does.lower():
                found.append(f"{DOC}:{line}: {pid} names no test ({NO_TEST}) but does not say \"{NOT_YET}\"")
            continue
        named = re.findall(r"`([^`]+)`", test_cell)
        rest = re.sub(r"`[^`]+`", "", test_cell)
        if not named or re.sub(r"[\s,;]|\band\b", "", rest):
            found.append(f"{DOC}:{line}: {pid}'s test cell must be {NO_TEST} or test names in backticks "
                         f"separated by commas, not: {test_cell}")
        for name in named:
            if name not in tests:
                found.append(f"{DOC}:{line}: {pid} names `{name}`, which no test defines (TEST… in "
                             "tests/**/*.cpp, def test_* in tests/python or tests/scripts, add_test in "
                             "tests/CMakeLists.txt)")
    uses = id_uses(source)
    if not uses:
        found.append(f"no pitfall ID is used in {', '.join(SCANNED)}: the scan finds none, so it checks nothing")
    for pid, where in sorted(uses.items(), key=lambda u: (u[0][0], int(u[0][1:]))):
        if pid not in first:
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            found.append(f"{pid} is used at {', '.join(where[:3])}{more} but has no row in {DOC}")
    return found


def self_check(source):
    """The ID scan takes every form of ID and nothing else (the rules' breaches are PLANTS)."""
    sample = [
        ("  optimizer_.zero_grad();  // T10: set to none", ["T10"]),
        ('log_info("lr = {} (T7)", lr); // X2/X5, X6–X8', ["T7", "X2", "X5", "X6", "X8"]),
        ("TEST(TrainCli, MatmulPrecisionAndCudnnBenchmarkAreReadBackT5T9) {", ["T5", "T9"]),
        ("TEST(DeviceInput, BatchesArePinnedForTheGpuD9_CUDA) {", ["D9"]),
        ("TEST(Trainer, SyncDebugAndDeterminismReachTorchT14M6) {", ["T14", "M6"]),
        ("    def test_ranks_shards_cover_the_data_set_X1(self):", ["X1"]),
        ("if (data[1] == 0xD8) return Encoding::kJpeg;  // D2D copies, X86_64", []),
        ('memcpy(p, "\\xFF\\xD8\\xFF", 3);  // JPEG (FF D8 FF), see D2', ["D2"]),
        ("// [mean (C), M2 (C), count (1)] per rank (M3)", ["M3"]),
        ("case DType::kF8E5M2: {\"F8_E4M3\", \"float8_e5m2\"}  // 2000-01-01T00:00:00Z", []),
    ]
    for line, want in sample:
        if ids_in(line) != want:
            return f"the ID scan gave {ids_in(line)} for {line!r}, not {want}"
    return None


def first_row(text):
    """(text's lines, the index of the catalogue's first row among them)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("|") and re.fullmatch(ID, cells(line)[0]):
            return lines, i
    raise source_scan.PlantError(f"{DOC} has no row")


def insert_row(row):
    """An edit of the catalogue: `row` inserted after its first row."""
    def change(text):
        lines, i = first_row(text)
        return "\n".join(lines[:i + 1] + [row] + lines[i + 1:])
    return source_scan.edit(DOC, change)


def double_first_row(text):
    lines, i = first_row(text)
    return "\n".join(lines[:i + 1] + lines[i:])


def unknown_test_in_first_row(text):
    lines, i = first_row(text)
    c = cells(lines[i])
    lines[i] = "| " + " | ".join(c[:3] + [re.sub(r"`[^`]+`", "`Planted.NoSuchTest`", c[3], count=1)]) + " |"
    return "\n".join(lines)


def header_only(text):
    lines, i = first_row(text)
    return "\n".join(line for line in lines if not (line.startswith("|") and re.fullmatch(ID, cells(line)[0])))


P = source_scan
PLANTS = [  # (the breach, its edits, what its one finding must say, or None for none)
    ("an ID used with no row", P.create("src/planted.cpp", "// a pitfall with no row (X99)\n"),
     "X99 is used at src/planted.cpp:1 but has no row"),
    ("an ID in a test's name with no row", P.create("tests/planted_test.cpp", "TEST(Planted, FailsX98_CUDA) {}\n"),
     "X98 is used at tests/planted_test.cpp:1 but has no row"),
    ("a row doubled", P.edit(DOC, double_first_row), "has a second row"),
    ("a row naming a test that does not exist", P.edit(DOC, unknown_test_in_first_row),
     "names `Planted.NoSuchTest`, which no test defines"),
    ("a test named without backticks", insert_row("| X97 | planted | planted | Planted.NoSuchTest |"),
     "X97's test cell must be"),
    ("a row with no test that does not say not yet", insert_row(f"| X96 | planted | handled | {NO_TEST} |"),
     f'X96 names no test ({NO_TEST}) but does not say "{NOT_YET}"'),
    ("a row with no test that says not yet", insert_row(f"| X95 | planted | Not yet handled. | {NO_TEST} |"), None),
    ("a row with three cells", insert_row("| X94 | planted | planted |"), "X94's row has 3 cells, not 4"),
    ("a table of IDs with another header", P.append(DOC, "\n| ID | what | does | test |\n|---|---|---|---|"),
     "a table's header is not"),
    ("a row in a table without a header", P.append(DOC, f"\n| X93 | planted | not yet | {NO_TEST} |"),
     "X93 is in a table without the header"),
    *((f"{rel} removed", P.remove(rel), f"{rel}: missing") for rel in (DOC, CMAKE, *SCANNED)),
    ("a tree where no ID is used", [*(P.remove(top + "/*") for top in SCANNED), P.create(CMAKE, ""),
                                    P.edit(DOC, header_only)], "no pitfall ID is used"),
]


def main():
    source_scan.run("pitfalls_test", violations, TOPS, PLANTS, f"{DOC} does not match the tree",
                    "every ID used in the tree has a row, and every test a row names exists",
                    self_check=self_check)


if __name__ == "__main__":
    main()
