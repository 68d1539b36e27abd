#!/usr/bin/python3
"""docs/DESIGN.md, "Layers": a layer uses only the layers above it in the list
core, io, data, nn, distributed, obs, train, commands, cli — so the loop (train) cannot call a
command, and nothing below train knows about training. This reads every #include of
crucible/<layer>/ (in quotes or angle brackets) in include/crucible/<layer>/ and src/<layer>/,
folders below them included, and fails naming each file that includes a lower layer's header
(the python module binds the library and may include any). It also fails on a folder of src/ or
include/crucible/ that is no layer of the list, a layer with no sources, and a tree where it
finds no include of crucible/ at all (then it would check nothing).

    tests/scripts/layers_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: each breach planted in a scratch copy of the tree must be the one new
finding (source_scan.py).
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

LAYERS = ["core", "io", "data", "nn", "distributed", "obs", "train", "commands", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]crucible/([a-z_]+)/')
TOPS = ("src", "include")
LAYER_DIRS = ("src", "include/crucible")


def violations(source):
    found = source_scan.missing(source, [f"src/{layer}/*" for layer in LAYERS], "layers_test.py")
    includes = 0
    for top in LAYER_DIRS:
        for path in sorted(glob.glob(os.path.join(source, top, "*", ""))):
            layer = os.path.basename(os.path.dirname(path))
            if layer not in LAYERS:
                found.append(f"{top}/{layer}: no layer of docs/DESIGN.md's list ({', '.join(LAYERS)}); add it there "
                             "and to LAYERS in its place")
                continue
            for file in sorted(glob.glob(os.path.join(path, "**", "*.[ch]*"), recursive=True)):
                rel = os.path.relpath(file, source)
                for i, line in enumerate(open(file, encoding="utf-8").read().split("\n")):
                    m = INCLUDE.match(line)
                    includes += bool(m)
                    if m and m.group(1) in LAYERS and LAYERS.index(m.group(1)) > LAYERS.index(layer):
                        found.append(f"{rel}:{i + 1}: {layer} includes {m.group(1)}: {line.strip()}")
    if not includes:
        found.append(f"no #include of crucible/<layer>/ in {' or '.join(LAYER_DIRS)}: the scan checks nothing")
    return found


P = source_scan
PLANTS = [  # (the breach, its edits, what its one finding must say, or None for none)
    ("data includes train", P.append("src/data/samplers/sampler.cpp", '#include "crucible/train/job.h"'),
     "src/data/samplers/sampler.cpp:"),
    ("a data header includes train in angle brackets",
     P.append("include/crucible/data/samplers/sampler.h", "#include <crucible/train/job.h>"), "data includes train"),
    ("the loop includes a command", P.append("src/train/trainer.cpp", '#include "crucible/commands/tune.h"'),
     "train includes commands"),
    ("a file in a folder below a layer includes a lower layer",
     P.create("src/core/detail/planted.cpp", '#include "crucible/io/file.h"\n'),
     "src/core/detail/planted.cpp:1: core includes io"),
    ("train includes data (a layer above it)", P.append("src/train/trainer.cpp", '#include "crucible/data/x.h"'),
     None),
    ("a folder that is no layer", P.create("src/runtime/planted.cpp", "\n"), "src/runtime: no layer"),
    ("a header folder that is no layer", P.create("include/crucible/runtime/planted.h", "\n"),
     "include/crucible/runtime: no layer"),
    ("a layer with no sources", P.remove("src/cli"), "src/cli/*: missing"),
    ("every include spelled otherwise", [P.replace(f"{top}/**/*.*", '"crucible/', '"crucible_/') for top in TOPS],
     "no #include of crucible/<layer>/"),
]


def main():
    source_scan.run("layers_test", violations, TOPS, PLANTS,
                    'includes of a lower layer (docs/DESIGN.md, "Layers")',
                    f"every include follows {' > '.join(LAYERS)}")


if __name__ == "__main__":
    main()
