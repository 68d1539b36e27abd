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
Comments do not count. A self-check first plants one breach of each rule in a scratch copy of
its file and must find exactly it, so each rule can fail (source_scan.py).

    tests/scripts/structure_test.py [--source DIR]    # exit 0 clean, 1 with the list
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

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
TRAIN_INCLUDE = re.compile(r'#\s*include\s*"crucible/train/')


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


def violations(root):
    found = []
    loop = os.path.join(root, "src/train/trainer.cpp")
    if os.path.exists(loop):
        n = open(loop, encoding="utf-8").read().count("\n")
        if n > MAX_LOOP_LINES:
            found.append(f"src/train/trainer.cpp: {n} lines, more than {MAX_LOOP_LINES}: the loop only")
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
            for line in lines_matching(code, re.compile(r"\bgetenv\b")):
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
            for line in lines_matching(code, re.compile(SEAM_VAR)):
                found.append(f"{rel}:{line}: names a test seam's variable; only {SEAM_FILE} may")
    return found


PLANTS = [  # (file, text appended, what the one finding must say)
    ("src/train/trainer.cpp", "\n" * (MAX_LOOP_LINES + 1), "the loop only"),
    ("src/commands/evaluate.cpp", "void long_one() {\n" + "  int x = 0;\n" * MAX_FUNCTION_LINES + "}\n",
     "long_one"),
    ("src/commands/predict.cpp", "void f() { auto j = join_job(c); }\n", "calls the assembly"),
    ("src/commands/predict.cpp", 'const char* k = "ema.n_averaged";\n', "EMA checkpoint key"),
    ("src/train/loss.cpp", 'const char* v = std::getenv("HOME");\n', "getenv in the train layer"),
    ("src/train/loss.cpp", 'const char* s = "CRUCIBLE_TEST_SOMETHING";\n', "test seam"),
    ("src/cli/data_commands.cpp", '#include "crucible/train/job_config.h"\n', "includes the train layer"),
]


def main():
    source_scan.run("structure_test", violations, PLANTS, "the house rules are broken",
                    "the loop is a loop, functions are short, the assembly, the EMA's keys and the environment "
                    "each have one home; the data commands build without the train layer")


if __name__ == "__main__":
    main()
