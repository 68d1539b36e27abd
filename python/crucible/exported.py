"""Train a Python-defined model with crucible, through torch.export (no TorchScript).

    import crucible
    crucible.export(model, example_input, "net.pt2")           # both modes, a dynamic batch
    result = crucible.train(model, example_input, data=(x, y, x_test, y_test), train__epochs=3)
    result.model, result.summary["test_acc"]

`export` writes a PT2 archive holding two programs over the same weights: "train" (the model
exported in train mode: dropout on, BatchNorm on batch statistics and updating its buffers) and
"model" (eval mode: the name torch.export.load reads, so that it gives the inference program),
each with a dynamic batch dimension, through torch's own archive writer. crucible's
`model.name = "exported"` trains the first and evaluates with the second.

`train` runs crucible's trainer in a process of its own. crucible links its own libtorch, which
need not be this Python's torch (Debian's 1.13 beside a 2.x wheel); one process per run keeps
them apart, lets a run use every core without the GIL, and a crash or a kill -9 of the trainer
leaves this interpreter alive with the run's checkpoints for a resume.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

__all__ = ["export", "load_exported", "train", "TrainResult", "TrainError"]


def export(model, example_input, path, dynamic_batch=True):
    """Exports `model` in train and eval mode (torch.export.export) into one archive at `path`
    (.pt2) and returns the path. `example_input` is one batch [N, C, H, W] (N >= 2: torch.export
    specialises a size of 1). The model's own mode is restored afterwards; its weights are not
    changed (export traces with fake tensors)."""
    try:
        from torch.export.pt2_archive._package import package_pt2
    except ImportError as e:  # torch < 2.6
        raise RuntimeError(f"crucible.export needs torch >= 2.6 (torch.export's PT2 archive writer); this is "
                           f"torch {torch.__version__}") from e
    if not isinstance(example_input, torch.Tensor) or example_input.dim() != 4:
        raise ValueError("crucible.export: example_input must be one image batch, a tensor [N, C, H, W]")
    if dynamic_batch and example_input.shape[0] < 2:
        raise ValueError("crucible.export: give an example batch of at least 2 (torch.export fixes a size of 1)")
    path = os.fspath(path)
    if not path.endswith(".pt2"):
        raise ValueError(f"crucible.export: the archive's name must end in .pt2 (found {path!r})")
    shapes = ({0: torch.export.Dim("batch", min=1)},) if dynamic_batch else None
    was_training = model.training
    programs = {}
    try:
        for mode in ("train", "eval"):
            model.train(mode == "train")
            programs["train" if mode == "train" else "model"] = torch.export.export(
                model, (example_input,), dynamic_shapes=shapes)
    finally:
        model.train(was_training)
    tmp = os.path.join(os.path.dirname(path), ".tmp-" + os.path.basename(path))  # torch wants a .pt2 name
    package_pt2(tmp, exported_programs=programs)
    os.replace(tmp, path)
    return path


def load_exported(path, mode="eval"):
    """The ExportedProgram of `mode` ("train" or "eval") in an archive of crucible.export or one
    crucible wrote back (torch.export.load(path) gives the eval program too); a torch.export.save
    archive's one program for mode=None."""
    from torch.export.pt2_archive._package import load_pt2
    programs = load_pt2(os.fspath(path)).exported_programs
    if mode is None:
        if len(programs) != 1:
            raise ValueError(f"{path}: holds programs {sorted(programs)}: name the mode")
        return next(iter(programs.values()))
    if mode == "eval" and "eval" not in programs and "train" in programs and "model" in programs:
        mode = "model"
    if mode not in programs:
        raise ValueError(f"{path}: no program {mode!r} (it holds {sorted(programs)})")
    return programs[mode]


class TrainError(RuntimeError):
    """crucible train failed: `exit_code` is 1 (runtime failure), 2 (bad input or config) or 3
    (training diverged); the message ends with what the trainer said."""

    def __init__(self, exit_code, message):
        super().__init__(message)
        self.exit_code = exit_code


class TrainResult:
    """What crucible.train returns: the run's summary (summary.json), the model with the
    trained weights loaded back, and the run folder (checkpoints, metrics.jsonl, report)."""

    def __init__(self, summary, model, run_dir):
        self.summary, self.model, self.run_dir = summary, model, run_dir

    def __repr__(self):
        return f"TrainResult(run_dir={self.run_dir!r}, summary keys {sorted(self.summary)})"


def _binary():
    found = os.environ.get("CRUCIBLE") or shutil.which("crucible")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))  # <build>/python/crucible
    candidate = os.path.join(here, "..", "..", "crucible")
    if os.path.isfile(candidate):
        return os.path.normpath(candidate)
    raise RuntimeError("crucible.train: no crucible program found (set CRUCIBLE=/path/to/crucible or put it on PATH)")


def _setting(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return str(value)


def train(model, example_input, config=None, data=None, run_dir=None, settings=None, stream=None, **overrides):
    """Trains `model` with crucible and returns a TrainResult.

    config: a crucible TOML file (default: crucible's default job); data: (train_x, train_y,
    test_x, test_y) arrays or tensors (images [N, C, H, W], integer labels [N]), written as .npy
    into the run folder and read as data.dataset = "arrays"; settings: {"train.epochs": 3, ...};
    overrides: the same with "__" for the dot (train__epochs=3). run_dir: the run's folder
    (default: a new temporary one, kept). Progress lines go to `stream` (default sys.stdout) as
    they come. Raises TrainError with the trainer's exit code when it fails."""
    stream = sys.stdout if stream is None else stream
    run_dir = os.path.abspath(run_dir or tempfile.mkdtemp(prefix="crucible-run-"))
    os.makedirs(run_dir, exist_ok=True)
    work = os.path.join(run_dir, "input")
    os.makedirs(work, exist_ok=True)
    archive = export(model, example_input, os.path.join(work, "model.pt2"))
    sets = {"run.dir": os.path.dirname(run_dir), "run.name": os.path.basename(run_dir),
            "model.name": "exported", "model.path": archive}
    if data is not None:
        import numpy as np
        if len(data) != 4:
            raise ValueError("crucible.train: data = (train_x, train_y, test_x, test_y)")
        keys = ("train_images", "train_labels", "test_images", "test_labels")
        sets["data.dataset"] = "arrays"
        for key, array in zip(keys, data):
            if isinstance(array, torch.Tensor):
                array = array.detach().cpu().numpy()
            file = os.path.join(work, key + ".npy")
            np.save(file, np.ascontiguousarray(array))
            sets["data." + key] = file
    for key, value in dict(settings or {}, **{k.replace("__", "."): v for k, v in overrides.items()}).items():
        sets[key] = _setting(value)
    cmd = [_binary(), "train"] + ([os.fspath(config)] if config is not None else [])
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    tail = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as p:
        for line in p.stdout:
            stream.write(line)
            tail = (tail + [line])[-20:]
        code = p.wait()
    if code != 0:
        raise TrainError(code, f"crucible train exited {code}:\n" + "".join(tail))
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    from . import load
    weights = load(os.path.join(run_dir, "model.safetensors"))
    device = next(model.parameters()).device
    model.load_state_dict({k: v.clone().to(device) for k, v in weights.items()}, strict=True)
    return TrainResult(summary, model, run_dir)
