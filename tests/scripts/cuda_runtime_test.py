#!/usr/bin/env python3
"""Issue 38: a CUDA build of crucible runs one CUDA runtime, the one its libtorch was built with.

crucible's own CUDA event calls need libcudart, which torch's CMake files link from the CUDA
toolkit; the dynamic loader loads one library per soname, so whichever libcudart the program
resolves first is the one the wheel's libtorch_cuda runs on too. This checks, with ldd, that every
given binary resolves libcudart to the file libtorch_cuda.so itself resolves it to.

  cuda_runtime_test.py BINARY...     (registered for CUDA builds in tests/CMakeLists.txt)
"""
import os
import re
import subprocess
import sys


def resolved(path):
    """{soname: resolved file} from ldd."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            libs[m.group(1)] = m.group(2)
    return libs


def main():
    binaries = sys.argv[1:]
    if not binaries:
        print(__doc__)
        return 2
    failures = []
    for binary in binaries:
        libs = resolved(binary)
        torch_cuda = libs.get("libtorch_cuda.so")
        cudart = {k: v for k, v in libs.items() if k.startswith("libcudart.so")}
        if torch_cuda is None or not cudart:
            failures.append(f"{binary}: no libtorch_cuda.so or libcudart in ldd's output ({sorted(libs)})")
            continue
        # What libtorch_cuda.so resolves on its own (its RUNPATH: the wheel's nvidia/*/lib).
        own = {k: v for k, v in resolved(torch_cuda).items() if k.startswith("libcudart.so")}
        for soname, path in cudart.items():
            want = own.get(soname)
            if want is None:
                failures.append(f"{binary}: links {soname} but {torch_cuda} does not")
            elif os.path.realpath(path) != os.path.realpath(want):
                failures.append(f"{binary}: {soname} resolves to {path}, but libtorch_cuda was built with {want}: "
                                "so libtorch_cuda would run on that runtime instead of its own")
            else:
                print(f"{binary}: {soname} → {path} (libtorch_cuda's own)")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
