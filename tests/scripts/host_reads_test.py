#!/usr/bin/python3
"""PITFALLS T6: the training path reads device values on the host only through
crucible::host_values() (src/core/host_read.cpp), which counts each read by reason so that
summary.json states the reads per step (TrainCli.HostReadsPerStepAreTheVoteAndTheIntervalT6
checks the count). This finds every other host read in the training path's sources — .item(),
a copy to the CPU (.to(at::kCPU…), .cpu()), at::equal() — and fails naming each one that does
not say, on its line or the line above, that it is "outside the step" (the end-of-run digest and
export, evaluation's gathers). Evaluation and its gather (evaluator.cpp, gather.cpp) are not the
training path, nor are the commands (src/commands: predict, tune's trial steps, …).

    tests/scripts/host_reads_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: a read planted in a scratch copy of step.cpp must be found.
"""
import argparse
import glob
import os
import re
import shutil
import sys
import tempfile

READ = re.compile(r"\.item\s*[<(]|\.to\s*\(\s*(at|torch|c10)::kCPU|\.cpu\s*\(\s*\)|\bat::equal\s*\(")
MARK = "outside the step"
TRAINING_PATH = ("src/train/*.cpp", "src/nn/*.cpp", "src/distributed/*.cpp", "src/data/device_input.cpp",
                 "src/core/compat*.cpp", "src/obs/phase_clock.cpp", "src/obs/layer_profile.cpp", "src/obs/histogram.cpp")
NOT_TRAINING = {"src/train/evaluator.cpp", "src/train/gather.cpp", "src/core/host_read.cpp"}


def violations(source):
    found = []
    for pattern in TRAINING_PATH:
        for path in sorted(glob.glob(os.path.join(source, pattern))):
            rel = os.path.relpath(path, source)
            if rel in NOT_TRAINING:
                continue
            lines = open(path, encoding="utf-8").read().split("\n")
            for i, line in enumerate(lines):
                code = line.split("//", 1)[0]
                if READ.search(code) and MARK not in line and (i == 0 or MARK not in lines[i - 1]):
                    found.append(f"{rel}:{i + 1}: {line.strip()}")
    return found


def self_check(source):
    with tempfile.TemporaryDirectory() as scratch:
        os.makedirs(os.path.join(scratch, "src/train"))
        shutil.copy(os.path.join(source, "src/train/step.cpp"), os.path.join(scratch, "src/train/step.cpp"))
        with open(os.path.join(scratch, "src/train/step.cpp"), "a", encoding="utf-8") as f:
            f.write("float planted(const at::Tensor& t) { return t.sum().item<float>(); }\n")
        found = violations(scratch)
        if len(found) != 1 or "planted" not in found[0]:
            print(f"host_reads_test: self-check failed: the planted read gave {found}", file=sys.stderr)
            sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    source = os.path.realpath(ap.parse_args().source)
    self_check(source)
    found = violations(source)
    if found:
        print("host reads in the training path that bypass host_values() (T6); read through "
              "crucible::host_values(tensor, HostRead::…) so they are counted, or say why the read is "
              f"'{MARK}':", file=sys.stderr)
        for f in found:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print("host_reads_test: ok: every host read in the training path goes through host_values()")


if __name__ == "__main__":
    main()
