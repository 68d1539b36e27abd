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
  - a row without a test (`—`) does not say "not yet", or an ID has two rows.

    tests/scripts/pitfalls_test.py [--source DIR]    # exit 0 clean, 1 with the list
Self-checks run first: the ID scan on a sample of the forms it must and must not take; an unknown
ID planted in a scratch file, and a row written twice, must each be the one new finding.
"""
import glob
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

DOC = "docs/PITFALLS.md"
SCANNED = ("src", "include", "tests", "python", "scripts", "bench")
HEADER = ["ID", "what goes wrong in plain PyTorch", "what crucible does", "the test that fails if it regresses"]
NOT_YET = "not yet"
NO_TEST = "—"

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
    (re.compile(r"\bFF D8 FF\b"), "the JPEG start-of-image bytes (include/crucible/data/decode.h)"),
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
            for i, line in enumerate(text.split("\n")):
                for pid in ids_in(line):
                    where = f"{rel}:{i + 1}"
                    if where not in uses.setdefault(pid, []):
                        uses[pid].append(where)
    return uses


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
    cmake = open(os.path.join(source, "tests", "CMakeLists.txt"), encoding="utf-8").read()
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


def violations(source, doc_text=None, extra_uses=None):
    """`doc_text` replaces docs/PITFALLS.md, `extra_uses` ({ID: [where]}) joins the tree's uses
    (both for the self-check)."""
    if doc_text is None:
        path = os.path.join(source, DOC)
        if not os.path.exists(path):
            return [f"{DOC} is missing"]
        doc_text = open(path, encoding="utf-8").read()
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
    for pid, where in (extra_uses or {}).items():
        uses.setdefault(pid, []).extend(where)
    for pid, where in sorted(uses.items(), key=lambda u: (u[0][0], int(u[0][1:]))):
        if pid not in first:
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            found.append(f"{pid} is used at {', '.join(where[:3])}{more} but has no row in {DOC}")
    return found


def self_check(source):
    """The scan must take every form of ID and nothing else; an unknown ID planted must be found."""
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
    doc = os.path.join(source, DOC)
    if not os.path.exists(doc):
        return None  # the scan of the tree says so
    unknown = "X" + "99"  # spelled in two parts, so that this file does not use it
    before = violations(source)
    with tempfile.TemporaryDirectory() as scratch:
        os.makedirs(os.path.join(scratch, "src"))
        with open(os.path.join(scratch, "src", "planted.cpp"), "w", encoding="utf-8") as f:
            f.write(f"// a pitfall with no row ({unknown})\n")
        after = violations(source, extra_uses=id_uses(scratch))
    new = [v for v in after if v not in before]
    if len(new) != 1 or not new[0].startswith(f"{unknown} is used at src/planted.cpp:1 "):
        return f"an {unknown} planted in src/planted.cpp gave {new}"
    table = rows(open(doc, encoding="utf-8").read())[0]
    if table:
        line, pid = table[0][:2]
        lines = open(doc, encoding="utf-8").read().split("\n")
        lines.insert(line, lines[line - 1])
        after = violations(source, doc_text="\n".join(lines))
        doubled = [v for v in after if "has a second row" in v]
        if len(doubled) != sum("has a second row" in v for v in before) + 1 or \
                not any(f"{pid} has a second row" in v for v in doubled):
            return f"{pid}'s row doubled gave {doubled}"
    return None


def main():
    # No plant of a file alone: the scan needs the catalogue, so self_check plants beside the tree.
    source_scan.run("pitfalls_test", violations, [], f"{DOC} does not match the tree",
                    "every ID used in the tree has a row, and every test a row names exists",
                    self_check=self_check)


if __name__ == "__main__":
    main()
