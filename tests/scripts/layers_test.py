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
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

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


def main():
    source_scan.run("layers_test", violations,
                    ("src/data/sampler.cpp", '#include "crucible/train/job.h"', "data includes train"),
                    'includes of a lower layer (docs/DESIGN.md, "Layers")',
                    f"every include follows {' > '.join(LAYERS)}")


if __name__ == "__main__":
    main()
