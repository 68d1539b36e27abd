#!/usr/bin/python3
"""PITFALLS T6: the training path reads device values on the host only through
crucible::host_values() (src/core/host_read.cpp), which counts each read by reason so that
summary.json states the reads per step (TrainCli.HostReadsPerStepAreTheVoteAndTheIntervalT6
checks the count). This finds every other host read in the training path's sources — .item(),
a copy to the CPU (.to(at::kCPU…), .cpu()), at::equal() — and fails naming each one that does
not say, on its line or the line above, that it is "outside the step" (the end-of-run digest and
export, evaluation's gathers). Evaluation and its gather (evaluator.cpp, gather.cpp) are not the
training path, nor are the commands (src/commands: predict, tune's trial steps, …).

It also fails naming each file (or pattern) of the lists below that is missing, and when
host_values' own read (host_read.cpp) is no read it finds: then the pattern is stale.

    tests/scripts/host_reads_test.py [--source DIR]    # exit 0 clean, 1 with the list
A self-check runs first: each breach planted in a scratch copy of the tree must be the one new
finding, and each exempt read none (source_scan.py).
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import source_scan  # noqa: E402

READ = re.compile(r"\.item\s*[<(]|\.to\s*\(\s*(at|torch|c10)::kCPU|\.cpu\s*\(\s*\)|\bat::equal\s*\(")
MARK = "outside the step"
TRAINING_PATH = ("src/train/*.cpp", "src/nn/*.cpp", "src/nn/detection/*.cpp", "src/distributed/*.cpp", "src/data/loader/device_input.cpp",
                 "src/core/compat*.cpp", "src/obs/phase_clock.cpp", "src/obs/layer_profile.cpp", "src/obs/histogram.cpp")
NOT_TRAINING = {"src/train/evaluator.cpp", "src/train/detection_eval.cpp", "src/train/eval_images.cpp", "src/train/gather.cpp", "src/core/host_read.cpp"}
HOST_READ = "src/core/host_read.cpp"
TOPS = ("src",)


def reads(lines):
    """The indices of `lines` that read on the host, comments aside."""
    return [i for i, line in enumerate(lines) if READ.search(line.split("//", 1)[0])]


def violations(source):
    found = source_scan.missing(source, [*TRAINING_PATH, *sorted(NOT_TRAINING)], "host_reads_test.py")
    home = os.path.join(source, HOST_READ)
    if os.path.isfile(home) and not reads(open(home, encoding="utf-8").read().split("\n")):
        found.append(f"{HOST_READ}: host_values' own read is none the pattern finds; the pattern is stale, so "
                     "the scan would miss reads written the same way")
    for pattern in TRAINING_PATH:
        for path in sorted(glob.glob(os.path.join(source, pattern))):
            rel = os.path.relpath(path, source)
            if rel in NOT_TRAINING:
                continue
            lines = open(path, encoding="utf-8").read().split("\n")
            for i in reads(lines):
                if MARK not in lines[i] and (i == 0 or MARK not in lines[i - 1]):
                    found.append(f"{rel}:{i + 1}: {lines[i].strip()}")
    return found


def read_in(label, rel, line, expect):
    return (f"{label} in {rel}", source_scan.append(rel, line), expect)


PLANTS = [  # (the breach, its edits, what its one finding must say, or None for none)
    read_in(".item()", "src/train/step.cpp", "float planted(const at::Tensor& t) { return t.sum().item<float>(); }",
            "src/train/step.cpp:"),
    read_in(".to(at::kCPU)", "src/nn/model.cpp", "at::Tensor planted(const at::Tensor& t) { return t.to(at::kCPU); }",
            "src/nn/model.cpp:"),
    read_in(".cpu()", "src/distributed/grad_sync.cpp", "at::Tensor planted(const at::Tensor& t) { return t.cpu(); }",
            "src/distributed/grad_sync.cpp:"),
    read_in("at::equal()", "src/data/loader/device_input.cpp",
            "bool planted(const at::Tensor& a) { return at::equal(a, a); }", "src/data/loader/device_input.cpp:"),
    read_in(".item()", "src/core/compat.cpp", "double planted(const at::Tensor& t) { return t.item().toDouble(); }",
            "src/core/compat.cpp:"),
    read_in(f"a read marked '{MARK}' on its line", "src/train/step.cpp",
            f"float planted(const at::Tensor& t) {{ return t.item<float>(); }}  // {MARK}", None),
    read_in(f"a read marked '{MARK}' on the line above", "src/train/step.cpp",
            f"// {MARK}: planted\nfloat planted(const at::Tensor& t) {{ return t.item<float>(); }}", None),
    read_in("a read in a comment", "src/train/step.cpp", "// t.item<float>()", None),
    read_in("a read in evaluation (no training path)", "src/train/evaluator.cpp",
            "float planted(const at::Tensor& t) { return t.item<float>(); }", None),
    *((f"{p} removed", source_scan.remove(p), f"{p}: missing")
      for p in [*TRAINING_PATH, *sorted(NOT_TRAINING)] if p != "src/train/*.cpp"),
    ("host_values' read written otherwise", source_scan.replace(HOST_READ, ".to(at::kCPU", ".to(at::kDouble"),
     "host_values' own read is none the pattern finds"),
]


def main():
    source_scan.run("host_reads_test", violations, TOPS, PLANTS,
                    "host reads in the training path that bypass host_values() (T6); read through "
                    "crucible::host_values(tensor, HostRead::…) so they are counted, or say why the read is "
                    f"'{MARK}'",
                    "every host read in the training path goes through host_values()")


if __name__ == "__main__":
    main()
