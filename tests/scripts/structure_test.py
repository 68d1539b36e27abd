#!/usr/bin/python3
"""The house rules of issue 36, as a count a reviewer would otherwise take by hand:
  - src/train/trainer.cpp (the loop) is at most 350 lines;
  - no function in src/train, src/commands or src/cli is longer than 80 lines;
  - join_job, assemble_job and assemble_data_stages are called only by the assembly
    (src/train/assembly.cpp) and the Session (src/train/session.cpp);
  - the weight EMA's checkpoint keys ("ema.…") are spelled only in src/train/ema.cpp;
  - getenv appears in src/train only in src/train/environment.cpp, and the test seams'
    variables (CRUCIBLE_TEST_…) are named only in include/crucible/train/environment.h;
  - the data commands (`crucible bench loader`: src/cli/data_commands.cpp; the Python loaders:
    python/module.cpp) include nothing of the train layer: they build their pipelines from the
    data layer and the pieces' own settings.
Comments do not count. A file a rule names (the loop, each rule's one home, the data commands)
that is missing is a violation, and so is a home where the rule's pattern finds nothing (a
renamed function or key would leave the rule checking nothing). A self-check first plants each
breach, each missing file and each emptied home in a scratch copy of the tree and must find
exactly it, so each rule can fail (source_scan.py).

    tests/scripts/structure_test.py [--source DIR]    # exit 0 clean, 1 with the list
"""
import functools
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

LOOP_FILE = "src/train/trainer.cpp"
MAX_LOOP_LINES = 350
MAX_FUNCTION_LINES = 80
FUNCTION_DIRS = ("src/train", "src/commands", "src/cli")
ASSEMBLERS = re.compile(r"\b(join_job|assemble_job|assemble_data_stages)\s*\(")
ASSEMBLY_CALLERS = {"src/train/assembly.cpp", "src/train/session.cpp"}
EMA_KEY = re.compile(r'"ema\.')
EMA_FILE = "src/train/ema.cpp"
SEAM_VAR = "CRUCIBLE_TEST_"
SEAM_FILE = "include/crucible/train/environment.h"
ENV_FILE = "src/train/environment.cpp"
DATA_COMMANDS = {"src/cli/data_commands.cpp", "python/module.cpp"}
TRAIN_INCLUDE = re.compile(r'#\s*include\s*[<"]crucible/train/')
GETENV = re.compile(r"\bgetenv\b")
SEAM = re.compile(SEAM_VAR)
# What the scan reads (the self-check copies it), and the files its rules name.
TOPS = ("src", "include", "python")
NAMED = [LOOP_FILE, *sorted(ASSEMBLY_CALLERS), EMA_FILE, ENV_FILE, SEAM_FILE, *sorted(DATA_COMMANDS),
         *(d + "/*.cpp" for d in FUNCTION_DIRS)]


@functools.lru_cache(maxsize=None)
def blank(text, keep_strings):
    """`text` with comments (and, unless keep_strings, string and char literals' contents)
    replaced by spaces, newlines kept, so offsets and line numbers stay."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith('R"(', i):
            j = text.find(')"', i)
            j = n if j < 0 else j + 2
            if keep_strings:
                out.append(text[i:j])
                i = j
                continue
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            if keep_strings:
                out.append(text[i:j])
                i = j
                continue
            out.append(text[i] + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + text[j - 1])
            i = j
            continue
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def functions(code):
    """(first line, lines, name) of every function body at namespace or class scope of `code`
    (comments and strings blanked): a brace whose header has parentheses and is no control
    statement, initialiser or enum. Lambdas and blocks inside a function count as the function's."""
    stack, last, found = [], 0, []
    for m in re.finditer(r"[{};]", code):
        ch, p = m.group(), m.start()
        if ch == "{":
            head = code[last:p].strip()
            outer = stack[-1][0] if stack else "scope"
            kind = "block"
            if re.search(r"\bnamespace\b", head) or head.startswith('extern "C"'):
                kind = "scope"
            elif re.match(r"(template\s*<.*>\s*)?(struct|class|union)\b", head, re.S) and "(" not in head.split(":")[0]:
                kind = "scope"
            elif (outer == "scope" and "(" in head and not re.match(r"(if|for|while|switch|catch|enum)\b", head)
                  and not head.endswith("=")):
                kind = "function"
            start = code.count("\n", 0, p - len(code[last:p].lstrip())) + 1 if head else code.count("\n", 0, p) + 1
            stack.append((kind, start, head))
            last = p + 1
        elif ch == "}":
            if stack:
                kind, start, head = stack.pop()
                if kind == "function":
                    end = code.count("\n", 0, p) + 1
                    found.append((start, end - start + 1, " ".join(head.split("(")[0].split())[-60:]))
            last = p + 1
        elif not stack or stack[-1][0] == "scope":
            last = p + 1
    return found


def sources(root, patterns):
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            yield os.path.relpath(path, root), open(path, encoding="utf-8").read()


def lines_matching(text, pattern):
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def read(root, rel):
    return open(os.path.join(root, rel), encoding="utf-8").read()


def empty_homes(root):
    """A finding for each rule whose home (present) holds nothing its pattern finds, or whose
    folder holds no function: the pattern no longer matches the tree, and the rule checks nothing."""
    found = []
    for d in FUNCTION_DIRS:
        if glob.glob(os.path.join(root, d, "*.cpp")) and not any(
                functions(blank(text, keep_strings=False)) for _, text in sources(root, [d + "/*.cpp"])):
            found.append(f"{d}/*.cpp: no function found; the {MAX_FUNCTION_LINES}-line rule checks nothing")
    train = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "src/train/*.cpp")))
    homes = [  # (where, its files, the pattern, whether string literals are kept, what it must find)
        (None, sorted(ASSEMBLY_CALLERS), ASSEMBLERS, False,
         "no call of join_job, assemble_job or assemble_data_stages"),
        (None, [EMA_FILE], EMA_KEY, True, 'spells no EMA checkpoint key ("ema.")'),
        (None, [ENV_FILE], GETENV, False, "calls no getenv"),
        (None, [SEAM_FILE], SEAM, True, f"names no test seam's variable ({SEAM_VAR}…)"),
        ("src/train/*.cpp", train, TRAIN_INCLUDE, True, 'includes no "crucible/train/…" header'),
    ]
    for where, files, pattern, keep_strings, what in homes:
        present = [f for f in files if os.path.isfile(os.path.join(root, f))]
        if present and not any(lines_matching(blank(read(root, f), keep_strings), pattern) for f in present):
            found.append(f"{where or ', '.join(present)}: {what}; the rule's pattern no longer matches the tree, "
                         "so it checks nothing")
    return found


def violations(root):
    found = source_scan.missing(root, NAMED, "structure_test.py") + empty_homes(root)
    if os.path.isfile(os.path.join(root, LOOP_FILE)):
        n = read(root, LOOP_FILE).count("\n")
        if n > MAX_LOOP_LINES:
            found.append(f"{LOOP_FILE}: {n} lines, more than {MAX_LOOP_LINES}: the loop only")
    for rel, text in sources(root, [d + "/*.cpp" for d in FUNCTION_DIRS]):
        for start, n, name in functions(blank(text, keep_strings=False)):
            if n > MAX_FUNCTION_LINES:
                found.append(f"{rel}:{start}: {name}: {n} lines, more than {MAX_FUNCTION_LINES}")
    for rel, text in sources(root, ["src/**/*.cpp", "python/**/*.cpp"]):
        code = blank(text, keep_strings=False)
        if rel not in ASSEMBLY_CALLERS:
            for line in lines_matching(code, ASSEMBLERS):
                found.append(f"{rel}:{line}: calls the assembly; only the Session and assembly.cpp may")
        if rel.startswith("src/train/") and rel != ENV_FILE:
            for line in lines_matching(code, GETENV):
                found.append(f"{rel}:{line}: getenv in the train layer; read it in {ENV_FILE}")
        if rel in DATA_COMMANDS:
            for line in lines_matching(blank(text, keep_strings=True), TRAIN_INCLUDE):
                found.append(f"{rel}:{line}: a data command includes the train layer; build from src/data")
    for rel, text in sources(root, ["src/**/*.cpp", "src/**/*.h", "include/**/*.h", "python/**/*.cpp", "python/**/*.py"]):
        code = blank(text, keep_strings=True) if not rel.endswith(".py") else text
        if rel != EMA_FILE:
            for line in lines_matching(code, EMA_KEY):
                found.append(f'{rel}:{line}: spells an EMA checkpoint key ("ema."); only {EMA_FILE} may')
        if rel != SEAM_FILE:
            for line in lines_matching(code, SEAM):
                found.append(f"{rel}:{line}: names a test seam's variable; only {SEAM_FILE} may")
    return found


def long_function(name):
    """A function one line longer than the rule allows, its braces' lines included."""
    return f"void {name}() {{\n" + "  int x = 0;\n" * (MAX_FUNCTION_LINES - 1) + "}"


def one_line_too_many(text):
    return text + "\n" * (MAX_LOOP_LINES + 1 - text.count("\n"))


def rename_assembly(text):
    return ASSEMBLERS.sub(lambda m: "renamed_" + m.group(0), text)


P = source_scan
PLANTS = [  # (the breach, its edits, what its one finding must say)
    ("the loop made one line too long", P.edit(LOOP_FILE, one_line_too_many),
     f"{MAX_LOOP_LINES + 1} lines, more than {MAX_LOOP_LINES}: the loop only"),
    *((f"a function of {MAX_FUNCTION_LINES + 1} lines in {rel}", P.append(rel, long_function("long_one")),
       f"long_one: {MAX_FUNCTION_LINES + 1} lines")
      for rel in ("src/train/loss.cpp", "src/commands/evaluate.cpp", "src/cli/front.cpp")),
    *((f"the assembly called from {rel}", P.append(rel, "void f() { auto j = join_job(c); }"), "calls the assembly")
      for rel in ("src/commands/predict.cpp", "python/module.cpp")),
    *((f"an EMA key spelled in {rel}", P.append(rel, line), "EMA checkpoint key")
      for rel, line in (("src/commands/predict.cpp", 'const char* k = "ema.n_averaged";'),
                        ("include/crucible/train/job.h", 'inline const char* k = "ema.n_averaged";'),
                        ("python/crucible/exported.py", 'KEY = "ema.n_averaged"'))),
    ("getenv in src/train/loss.cpp", P.append("src/train/loss.cpp", 'const char* v = std::getenv("HOME");'),
     "getenv in the train layer"),
    *((f"a test seam's variable named in {rel}", P.append(rel, line), "test seam")
      for rel, line in (("src/train/loss.cpp", 'const char* s = "CRUCIBLE_TEST_SOMETHING";'),
                        ("python/crucible/exported.py", 'SEAM = "CRUCIBLE_TEST_SOMETHING"'))),
    *((f"the train layer included by {rel}", P.append(rel, '#include "crucible/train/job_config.h"'),
       "includes the train layer") for rel in sorted(DATA_COMMANDS)),
    ("the train layer included in angle brackets",
     P.append("src/cli/data_commands.cpp", "#include <crucible/train/job_config.h>"), "includes the train layer"),
    *((f"{rel} removed", P.remove(rel), f"{rel}: missing") for rel in NAMED if "*" not in rel),
    ("every src/commands/*.cpp removed", P.remove("src/commands/*.cpp"), "src/commands/*.cpp: missing"),
    ("src/commands/*.cpp holding no function",
     [P.remove("src/commands/*.cpp"), P.create("src/commands/planted.cpp", "int planted = 0;\n")],
     "src/commands/*.cpp: no function found"),
    ("the assembly's functions renamed", [P.edit(rel, rename_assembly) for rel in sorted(ASSEMBLY_CALLERS)],
     "no call of join_job"),
    ("the EMA's keys spelled otherwise", P.replace(EMA_FILE, '"ema.', '"ema_'), "spells no EMA checkpoint key"),
    ("getenv renamed in its home", P.replace(ENV_FILE, "getenv", "secure_getenv"), "calls no getenv"),
    ("the seams' variables renamed", P.replace(SEAM_FILE, SEAM_VAR, "CRUCIBLE_SEAM_"), "names no test seam"),
    ("the train layer's includes spelled otherwise",
     P.replace("src/train/*.cpp", '#include "crucible/train/', '#include "crucible/training/'),
     'includes no "crucible/train/'),
]


def main():
    source_scan.run("structure_test", violations, TOPS, PLANTS, "the house rules are broken",
                    "the loop is a loop, functions are short, the assembly, the EMA's keys and the environment "
                    "each have one home; the data commands build without the train layer")


if __name__ == "__main__":
    main()
