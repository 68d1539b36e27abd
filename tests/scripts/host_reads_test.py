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
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

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


def main():
    source_scan.run("host_reads_test", violations,
                    ("src/train/step.cpp", "float planted(const at::Tensor& t) { return t.sum().item<float>(); }",
                     "planted"),
                    "host reads in the training path that bypass host_values() (T6); read through "
                    "crucible::host_values(tensor, HostRead::…) so they are counted, or say why the read is "
                    f"'{MARK}'",
                    "every host read in the training path goes through host_values()")


if __name__ == "__main__":
    main()
