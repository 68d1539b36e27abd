#!/usr/bin/python3
"""docs/DESIGN.md, "Layers": a layer uses only the layers above it in the list
core, io, data, nn, distributed, obs, train, commands, cli — so the loop (train) cannot call a
command, and nothing below train knows about training. This reads every #include "crucible/…"
in include/crucible/<layer>/ and src/<layer>/ and fails naming each file that includes a lower
layer's header (the python module binds the library and may include any).

    tests/scripts/layers_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: an include of train/ planted in a scratch copy of a data/ source must be
found.
"""
import argparse
import glob
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["core", "io", "data", "nn", "distributed", "obs", "train", "commands", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"crucible/([a-z_]+)/')


def layer_of(rel):
    parts = rel.split(os.sep)
    if parts[0] == "include":
        return parts[2]
    return parts[1]


def violations(source):
    found = []
    files = glob.glob(os.path.join(source, "include/crucible/*/*.h")) + glob.glob(os.path.join(source, "src/*/*.[ch]*"))
    for path in sorted(files):
        rel = os.path.relpath(path, source)
        layer = layer_of(rel)
        if layer not in LAYERS:
            continue
        for i, line in enumerate(open(path, encoding="utf-8").read().split("\n")):
            m = INCLUDE.match(line)
            if m and m.group(1) in LAYERS and LAYERS.index(m.group(1)) > LAYERS.index(layer):
                found.append(f"{rel}:{i + 1}: {layer} includes {m.group(1)}: {line.strip()}")
    return found


def self_check(source):
    with tempfile.TemporaryDirectory() as scratch:
        os.makedirs(os.path.join(scratch, "src/data"))
        target = os.path.join(scratch, "src/data/sampler.cpp")
        shutil.copy(os.path.join(source, "src/data/sampler.cpp"), target)
        with open(target, "a", encoding="utf-8") as f:
            f.write('#include "crucible/train/job.h"\n')
        found = violations(scratch)
        if len(found) != 1 or "data includes train" not in found[0]:
            print(f"layers_test: self-check failed: the planted include gave {found}", file=sys.stderr)
            sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    source = os.path.realpath(ap.parse_args().source)
    self_check(source)
    found = violations(source)
    if found:
        print("layers_test: includes of a lower layer (docs/DESIGN.md, \"Layers\"):", file=sys.stderr)
        for f in found:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print(f"layers_test: ok: every include follows {' > '.join(LAYERS)}")


if __name__ == "__main__":
    main()
