"""What the tests that scan the source tree share (host_reads_test.py, layers_test.py,
structure_test.py, pitfalls_test.py): the --source argument, a self-check that plants each
violation in a scratch copy of a file and must find exactly it (so the scan can fail), then the
scan of the tree, printing each violation."""
import argparse
import os
import shutil
import sys
import tempfile


def run(name, violations, plants, what, ok, self_check=None):
    """`violations(source)` lists the violations under `source`; `plants` = one (relative path,
    text to append, text the one finding must contain) or a list of them, each tried alone in a
    scratch copy of its file; `self_check(source)`, when given, checks more and returns a problem
    or None. `what` heads the list of violations, `ok` the line printed when there are none.
    Exits 1 on a failed self-check or any violation."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    source = os.path.realpath(ap.parse_args().source)
    for rel, line, expect in [plants] if isinstance(plants, tuple) else plants:
        with tempfile.TemporaryDirectory() as scratch:
            os.makedirs(os.path.join(scratch, os.path.dirname(rel)))
            shutil.copy(os.path.join(source, rel), os.path.join(scratch, rel))
            with open(os.path.join(scratch, rel), "a", encoding="utf-8") as f:
                f.write(line + "\n")
            found = violations(scratch)
            if len(found) != 1 or expect not in found[0]:
                print(f"{name}: self-check failed: the line planted in {rel} gave {found}", file=sys.stderr)
                sys.exit(1)
    problem = self_check(source) if self_check else None
    if problem:
        print(f"{name}: self-check failed: {problem}", file=sys.stderr)
        sys.exit(1)
    found = violations(source)
    if found:
        print(f"{name}: {what}:", file=sys.stderr)
        for f in found:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print(f"{name}: ok: {ok}")
