#!/usr/bin/python3
"""DESIGN.md, "libtorch versions": every libtorch version difference lives in src/core/compat*;
nowhere else tests the version. This finds every version test in the C++ sources (torch's
version macros and its version header, and CUDA's, cuDNN's and NCCL's version macros) and fails
naming each one outside compat. compat's own test may read the macros to check compat. It also
fails naming a folder it scans that is missing, and when compat itself holds no version test
it finds (then the pattern is stale, and would miss the same test elsewhere).

    tests/scripts/version_tests_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: each form of version test planted in a scratch copy of the tree must be
the one new finding, and one in compat none (source_scan.py).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

VERSION_TEST = re.compile(
    r"\b(TORCH_VERSION\w*|C10_VERSION\w*|CUDA_VERSION|CUDART_VERSION|CUDNN_VERSION\w*|CUDNN_MAJOR|NCCL_VERSION\w*|"
    r"NCCL_MAJOR|NCCL_MINOR)\b|#\s*include\s*[<\"]torch/version\.h[>\"]")
ALLOWED = re.compile(r"^(src/core/compat[^/]*|include/crucible/core/compat[^/]*|tests/core/compat_test\.cpp)$")
COMPAT = "src/core/compat*"
TREES = ("src", "include", "tests", "bench", "fuzz", "python", "examples")
EXTS = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh", ".in")


def version_tests(path):
    """(line number, line) of each version test in the file `path`."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [(no, line.strip()) for no, line in enumerate(f, 1) if VERSION_TEST.search(line)]


def violations(source):
    found = source_scan.missing(source, TREES, "version_tests_test.py")
    if os.path.isdir(os.path.join(source, "src")):
        found += source_scan.missing(source, [COMPAT], "version_tests_test.py")
    compat_files = compat_tests = 0
    for tree in TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(source, tree)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "build")))
            for n in sorted(filenames):
                if not n.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, source)
                if ALLOWED.match(rel):
                    compat_files += rel.startswith("src/core/")
                    compat_tests += rel.startswith("src/core/") and bool(version_tests(path))
                    continue
                found += [f"{rel}:{no}: {line}" for no, line in version_tests(path)]
    if compat_files and not compat_tests:
        found.append(f"{COMPAT}: no version test the pattern finds; it no longer matches how compat tests the "
                     "version, and would miss the same test elsewhere")
    return found


P = source_scan
FORMS = [  # (a file outside compat, a version test in it): every form, across the trees and extensions
    ("src/train/planted.cpp", "#if TORCH_VERSION_MAJOR >= 2"),
    ("include/crucible/train/planted.h", "#include <torch/version.h>"),
    ("tests/train/planted_test.cpp", '#include "torch/version.h"'),
    ("bench/planted.cu", "#if CUDA_VERSION >= 12000"),
    ("fuzz/planted.cuh", "#if CUDART_VERSION >= 12000"),
    ("python/planted.hpp", "#if CUDNN_VERSION >= 8000"),
    ("examples/planted.cc", "#if CUDNN_MAJOR >= 8"),
    ("src/data/planted.h.in", "#if NCCL_VERSION_CODE >= 21000"),
    ("src/distributed/planted.cpp", "#if NCCL_MAJOR >= 2 && NCCL_MINOR >= 18"),
    ("src/nn/planted.cpp", "#if defined(C10_VERSION_MAJOR)"),
]
PLANTS = [  # (the breach, its edits, what its one finding must say, or None for none)
    *((f"{line} in {rel}", P.create(rel, f"{line}\n#endif\n"), f"{rel}:1: {line}") for rel, line in FORMS),
    *((f"{line} in {rel}", P.append(rel, f"{line}\n#endif"), None)
      for rel, line in (("src/core/compat.cpp", "#if TORCH_VERSION_MAJOR >= 3"),
                        ("tests/core/compat_test.cpp", "#if TORCH_VERSION_MAJOR >= 3"))),
    ("a version test in a build folder", P.create("python/build/planted.cpp", "#if TORCH_VERSION_MAJOR >= 2\n"), None),
    *((f"{tree} removed", P.remove(tree), f"{tree}: missing") for tree in TREES),
    ("compat removed", P.remove(COMPAT), f"{COMPAT}: missing"),
    ("compat's version tests written otherwise",
     [P.replace(COMPAT, "TORCH_VERSION", "TORCH_RELEASE"), P.replace(COMPAT, "torch/version.h", "torch/release.h")],
     f"{COMPAT}: no version test the pattern finds"),
]


def main():
    source_scan.run("version_tests_test", violations, TREES, PLANTS,
                    "version tests outside src/core/compat* (move the difference into compat)",
                    "no version test outside src/core/compat*")


if __name__ == "__main__":
    main()
