#!/usr/bin/python3
"""DESIGN.md, "libtorch versions": every libtorch version difference lives in src/core/compat*;
nowhere else tests the version. This finds every version test in the C++ sources (torch's
version macros and its version header, and CUDA's, cuDNN's and NCCL's version macros) and fails
naming each one outside compat. compat's own test may read the macros to check compat.

    tests/scripts/version_tests_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: a copy of compat's version test planted in a scratch tree must be found.
"""
import argparse
import os
import re
import sys
import tempfile

VERSION_TEST = re.compile(
    r"\b(TORCH_VERSION\w*|C10_VERSION\w*|CUDA_VERSION|CUDART_VERSION|CUDNN_VERSION\w*|CUDNN_MAJOR|NCCL_VERSION\w*|"
    r"NCCL_MAJOR|NCCL_MINOR)\b|#\s*include\s*[<\"]torch/version\.h[>\"]")
ALLOWED = re.compile(r"^(src/core/compat[^/]*|include/crucible/core/compat[^/]*|tests/core/compat_test\.cpp)$")
TREES = ("src", "include", "tests", "bench", "fuzz", "python", "examples")
EXTS = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh", ".in")


def violations(source):
    found = []
    for tree in TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(source, tree)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "build"))]
            for n in filenames:
                if not n.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, source)
                if ALLOWED.match(rel):
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for no, line in enumerate(f, 1):
                        if VERSION_TEST.search(line):
                            found.append(f"{rel}:{no}: {line.strip()}")
    return found


def self_check():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "src", "train"))
        os.makedirs(os.path.join(d, "src", "core"))
        with open(os.path.join(d, "src", "train", "x.cpp"), "w") as f:
            f.write("#include <torch/version.h>\n#if TORCH_VERSION_MAJOR >= 2\n#endif\n")
        with open(os.path.join(d, "src", "core", "compat.cpp"), "w") as f:
            f.write("#if TORCH_VERSION_MAJOR >= 2\n#endif\n")
        got = violations(d)
        if len(got) != 2 or not all(g.startswith("src/train/x.cpp:") for g in got):
            sys.exit(f"version_tests_test: the self-check found {got}, expected the 2 lines of src/train/x.cpp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    a = ap.parse_args()
    self_check()
    found = violations(a.source)
    if found:
        print("version tests outside src/core/compat* (move the difference into compat):", file=sys.stderr)
        for f in found:
            print("  " + f, file=sys.stderr)
        return 1
    print("version_tests_test: no version test outside src/core/compat*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
