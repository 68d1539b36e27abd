"""model.name = "exported" (issue 27): torch.export programs trained by crucible's C++ graph runner.

- The oracle: a tiny vision transformer (conv patches, BatchNorm, dropout, residuals, GELU,
  LayerNorm, F.scaled_dot_product_attention, a Python loop that export unrolls) exported by
  crucible.export and trained by `crucible train` for 50 fp32 AdamW steps equals the plain PyTorch
  loop on the same batches with the same dropout stream to 1e-4, BatchNorm buffers included.
- The archive written back (model.pt2) loads with torch's loader and gives eager's outputs;
  predict from it writes what predict from the run's checkpoint writes.
- (torchvision's resnet18 and VisionTransformer against eager: tests/nn/exported_test.cpp.)
- A kill -9 in mid-run, then a rerun: the uninterrupted run's params_sha256.
- Refusals, exit 2 naming what: another schema version, an op this libtorch lacks, a cond node, a
  single train-mode program asked to evaluate, an eval-mode program asked to train.
- crucible.train from a script that names no file of crucible's: PyTorch's own evaluation of the
  returned model is the run's (accuracy, loss, and crucible predict's probabilities sample by
  sample); it holds the run's model.safetensors, read without crucible; the training loss fell.

torch.export needs torch 2.x: ctest runs this as Python.ExportedPrograms in make test-torch2 only
(the venv's Python, CRUCIBLE = that build's crucible, PYTHONPATH = its python/).
"""
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import zipfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import crucible

CRUCIBLE = os.environ.get("CRUCIBLE", "crucible")
STEPS = 50  # 512 samples / batch 32 = 16 steps per epoch: 3 epoch ends, then mid-epoch


class Block(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        # No qkv bias: the keys' bias has an exactly zero gradient (softmax ignores a shift that
        # is the same for every key), and Adam turns the rounding noise of a zero gradient into
        # full-size steps, different ones for two correct implementations.
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.patch = nn.Conv2d(2, 16, 4, stride=4, bias=False)  # no bias before BatchNorm (M7): its gradient
        # is zero, see Block's qkv
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(16, classes)
        self.register_buffer("gain", torch.tensor(1.5), persistent=False)  # an archive constant

    def forward(self, x):
        x = self.bn(self.patch(x * self.gain)).flatten(2).transpose(1, 2)
        x = x + torch.tensor([0.25])  # a tensor made in forward: a lifted constant
        for blk in self.blocks:  # a Python loop: export unrolls it
            x = blk(x)
        return self.head(self.drop(self.norm(x).mean(1)))


def read_safetensors(path):
    return {k: v.clone() for k, v in crucible.load(path).items()}


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                       "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors_without_crucible(path):
    """{name: numpy array} of a .safetensors file, read with json, struct and numpy alone (the
    format: an 8-byte little-endian header length, a JSON header, the data): a reader that shares
    no code with crucible's, for checks of what crucible loaded."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        if info["dtype"] == "BF16":  # the upper half of a float32
            bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(info["shape"])
        else:
            out[name] = np.frombuffer(raw, _SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


class ExportedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = cls.tmp.name
        rng = np.random.default_rng(0)
        for split, n in (("train", 512), ("test", 64)):
            np.save(f"{d}/{split}_x.npy", rng.standard_normal((n, 2, 8, 8)).astype(np.float32))
            np.save(f"{d}/{split}_y.npy", rng.integers(0, 4, n).astype(np.int64))
        torch.manual_seed(0)
        cls.net = TinyViT()
        crucible.export(cls.net, torch.zeros(4, 2, 8, 8), f"{d}/net.pt2")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def train_cmd(self, name, archive, *extra, verb="train"):
        d = self.d
        sets = {"run.dir": d, "run.name": name, "model.name": "exported", "model.path": archive,
                "data.dataset": "arrays", "data.train_images": f"{d}/train_x.npy",
                "data.train_labels": f"{d}/train_y.npy", "data.test_images": f"{d}/test_x.npy",
                "data.test_labels": f"{d}/test_y.npy", "data.threads": 1, "train.epochs": 4,
                "train.max_steps": STEPS, "train.batch_size": 32, "train.eval_batch_size": 32,
                "train.precision": "fp32", "train.channels_last": "false", "train.threads": 1,
                "optim.name": "adamw", "optim.lr": 0.003, "optim.weight_decay": 0.01,
                "optim.decay_bias_and_norm": "true", "schedule.name": "constant", "loss.label_smoothing": 0,
                "checkpoint.every_steps": 10, "checkpoint.keep": 20, "log.every_steps": 10}
        cmd = [CRUCIBLE, verb]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd + list(extra)

    def test_trains_like_a_plain_pytorch_loop_and_writes_the_program_back(self):
        d = self.d
        r = run(self.train_cmd("oracle", f"{d}/net.pt2"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        log = r.stdout + r.stderr
        sampler = int(re.search(r"sampler ([0-9]+)", log).group(1))
        dropout = int(re.search(r"dropout ([0-9]+)", log).group(1))

        # The oracle: eager PyTorch, DistributedSampler's order for seed + epoch, the dropout
        # stream, AdamW on every tensor.
        torch.set_num_threads(1)
        x = torch.from_numpy(np.load(f"{d}/train_x.npy"))
        y = torch.from_numpy(np.load(f"{d}/train_y.npy"))
        m = TinyViT()
        m.load_state_dict(crucible.load_exported(f"{d}/net.pt2", "train").state_dict)
        start = {k: v.clone() for k, v in m.state_dict().items()}
        opt = torch.optim.AdamW(m.parameters(), lr=0.003, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                foreach=False)
        torch.manual_seed(dropout)
        m.train()
        step = epoch = 0
        while step < STEPS:
            g = torch.Generator()
            g.manual_seed((sampler + epoch) % 2**32)
            order = torch.randperm(len(x), generator=g)
            for first in range(0, len(x), 32):
                if step == STEPS:
                    break
                i = order[first:first + 32]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(m(x[i]), y[i]).backward()
                opt.step()
                step += 1
            epoch += 1
        mine = {k: v.detach() for k, v in m.state_dict().items()}
        got = read_safetensors(f"{d}/oracle/model.safetensors")
        self.assertEqual(sorted(got), sorted(mine))
        diff = max((mine[k].double() - got[k].double()).abs().max().item() for k in mine)
        moved = max((mine[k].double() - start[k].double()).abs().max().item()
                    for k in mine if mine[k].is_floating_point())
        print(f"\noracle: max abs difference {diff:.3g} over parameters and buffers (weights moved by up to "
              f"{moved:.3g})")
        self.assertLess(diff, 1e-4)
        self.assertGreater(moved, 1e-2)
        self.assertEqual(int(got["bn.num_batches_tracked"]), STEPS)  # buffers change in train mode only

        # Written back: torch.export.load reads model.pt2 and gives the eval program, with eager's
        # outputs.
        back = torch.export.load(f"{d}/oracle/model.pt2")
        for k, v in back.state_dict.items():
            self.assertTrue(torch.equal(v, got[k]), k)
        xt = torch.from_numpy(np.load(f"{d}/test_x.npy"))
        m.eval()
        with torch.no_grad():
            out_diff = (back.module()(xt) - m(xt)).abs().max().item()
        print(f"written back: eval outputs differ from eager's by {out_diff:.3g}")
        self.assertLess(out_diff, 1e-4)

        # predict from the archive written back (no run behind it) writes what predict from the
        # run's checkpoint writes.
        a = run(self.train_cmd("oracle", f"{d}/net.pt2", "--top", "3", "--out", f"{d}/ckpt.jsonl", verb="predict"))
        self.assertEqual(a.returncode, 0, a.stdout + a.stderr)
        b = run(self.train_cmd("nothing", f"{d}/oracle/model.pt2", "--top", "3", "--out", f"{d}/archive.jsonl",
                               verb="predict"))
        self.assertEqual(b.returncode, 0, b.stdout + b.stderr)
        self.assertIn("exported program", b.stdout + b.stderr)
        with open(f"{d}/ckpt.jsonl") as f1, open(f"{d}/archive.jsonl") as f2:
            ckpt, arch = f1.read(), f2.read()
        self.assertEqual(ckpt.count("\n"), 64)
        self.assertEqual(arch, ckpt)

        # crucible eval of the run evaluates its checkpoint with the eval program.
        e = run(self.train_cmd("oracle", f"{d}/net.pt2", verb="eval"))
        self.assertEqual(e.returncode, 0, e.stdout + e.stderr)

    def test_killed_mid_run_resumes_to_the_uninterrupted_weights(self):
        d = self.d
        r = run(self.train_cmd("whole", f"{d}/net.pt2"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(f"{d}/whole/summary.json") as f:
            want = json.load(f)["params_sha256"]
        env = dict(os.environ, CRUCIBLE_TEST_SAMPLE_DELAY_MS="2")
        cmd = self.train_cmd("killed", f"{d}/net.pt2")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        ckpt = f"{d}/killed/checkpoints/ckpt-000000020.safetensors"
        deadline = time.time() + 300
        while not os.path.exists(ckpt) and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        self.assertIsNone(p.poll(), "the run ended before it could be killed")
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.assertFalse(os.path.exists(f"{d}/killed/summary.json"))
        r = run(cmd)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("resumed from", r.stdout + r.stderr)
        with open(f"{d}/killed/summary.json") as f:
            s = json.load(f)
        self.assertGreaterEqual(s["resumed_from_step"], 20)
        self.assertEqual(s["params_sha256"], want)

    def test_data_parallel_syncs_gradients_and_refuses_sync_batch_norm(self):
        d = self.d
        # Two ranks: the parameters' gradient hooks all-reduce during backward, BatchNorm's
        # buffers are made equal by dist.bn = "broadcast", and the model trains. (That ranks
        # stay equal is checked at every checkpoint by the trainer's replica fingerprints: a
        # difference would fail the run.)
        cmd = self.train_cmd("ddp", f"{d}/net.pt2", "--set", "train.batch_size=16", "--set", "train.max_steps=12",
                             "--set", "dist.bn=broadcast")
        r = run([CRUCIBLE, "launch", "--nproc", "2", "--"] + cmd)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("all-reduced during backward", r.stdout + r.stderr)
        with open(f"{d}/ddp/summary.json") as f:
            s = json.load(f)
        self.assertEqual(s["world_size"], 2)
        ckpt = read_safetensors(f"{d}/ddp/model.safetensors")
        start = crucible.load_exported(f"{d}/net.pt2", "train").state_dict
        self.assertGreater(max((ckpt[k].double() - start[k].double()).abs().max().item()
                               for k in start if start[k].is_floating_point()), 1e-3)
        r = run([CRUCIBLE, "launch", "--nproc", "2", "--"] +
                self.train_cmd("ddp-sync", f"{d}/net.pt2", "--set", "dist.bn=sync"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("dist.bn = sync needs a model built from crucible's torch::nn modules", r.stderr)

    def refused(self, archive, *extra):
        r = run(self.train_cmd("refused-" + os.path.basename(archive), archive, *extra))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        return r.stderr

    def test_refusals_name_what_is_wrong(self):
        d = self.d
        # Another schema version: the program's JSON edited in a copy of the archive.
        with zipfile.ZipFile(f"{d}/net.pt2") as src, zipfile.ZipFile(f"{d}/v99.pt2", "w") as dst:
            for info in src.infolist():
                data = src.read(info.filename)
                if info.filename.endswith("models/train.json"):
                    doc = json.loads(data)
                    doc["schema_version"] = {"major": 99, "minor": 1}
                    data = json.dumps(doc).encode()
                dst.writestr(info, data)
        err = self.refused(f"{d}/v99.pt2")
        self.assertIn("99.1", err)
        self.assertIn("8.x", err)

        # An op this libtorch does not have: a custom op registered in this Python only.
        @torch.library.custom_op("crucible_test::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @twice.register_fake
        def _(x):
            return torch.empty_like(x)

        class Custom(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(128, 4)

            def forward(self, x):
                return self.fc(torch.ops.crucible_test.twice(x).flatten(1))

        crucible.export(Custom(), torch.zeros(4, 2, 8, 8), f"{d}/custom.pt2")
        err = self.refused(f"{d}/custom.pt2")
        self.assertIn("crucible_test::twice", err)
        self.assertIn("node \"twice\"", err)

        # A higher-order op: torch.cond.
        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(128, 4)

            def forward(self, x):
                x = torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))
                return self.fc(x.flatten(1))

        crucible.export(Branchy(), torch.zeros(4, 2, 8, 8), f"{d}/cond.pt2")
        err = self.refused(f"{d}/cond.pt2")
        self.assertIn("torch.ops.higher_order.cond", err)

        # One program, exported in train mode (torch.export.save): evaluation is refused unless
        # model.eval_with_train_program says to run it anyway.
        shape = {"x": {0: torch.export.Dim("batch", min=1)}}
        torch.export.save(torch.export.export(TinyViT().train(), (torch.zeros(4, 2, 8, 8),), dynamic_shapes=shape),
                          f"{d}/trainonly.pt2")
        err = self.refused(f"{d}/trainonly.pt2")
        self.assertIn("train mode", err)
        self.assertIn("model.eval_with_train_program", err)
        r = run(self.train_cmd("trainonly", f"{d}/trainonly.pt2", "--set", "model.eval_with_train_program=true",
                               "--set", "train.max_steps=4"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        # One program, exported in eval mode: training it is refused at its first step.
        torch.export.save(torch.export.export(TinyViT().eval(), (torch.zeros(4, 2, 8, 8),), dynamic_shapes=shape),
                          f"{d}/evalonly.pt2")
        err = self.refused(f"{d}/evalonly.pt2")
        self.assertIn("eval mode", err)
        self.assertIn("crucible.export", err)

        # A fixed batch size.
        torch.export.save(torch.export.export(TinyViT().eval(), (torch.zeros(4, 2, 8, 8),)), f"{d}/fixed.pt2")
        err = self.refused(f"{d}/fixed.pt2")
        self.assertIn("batches of exactly 4", err)


class PythonTrainTest(unittest.TestCase):
    def test_crucible_train_returns_the_trained_model(self):
        # Three classes a 3x3 convolution tells apart (horizontal stripes, vertical stripes, none)
        # under noise. The model crucible.train returns is evaluated by PyTorch itself (eval mode,
        # no_grad, a plain forward, argmax) on the test set: its accuracy and loss are the run's
        # summary's, its softmax probabilities those `crucible predict` writes for the run's final
        # checkpoint, sample by sample. Its tensors are the run's model.safetensors as read here
        # without crucible (json + struct + numpy), every weight moved, and the training loss fell.
        script = textwrap.dedent("""
            import copy, io, json, sys
            import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
            import crucible
            torch.manual_seed(0)
            model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(8, 3))
            before = copy.deepcopy(model.state_dict())
            rng = np.random.default_rng(0)
            def data(n):
                y = rng.integers(0, 3, n)
                x = 0.5 * rng.standard_normal((n, 1, 12, 12)).astype(np.float32)
                stripes = (np.arange(12) % 2).astype(np.float32) * 0.5
                x[y == 0] += stripes[None, None, :, None]  # horizontal
                x[y == 1] += stripes[None, None, None, :]  # vertical
                return x, y
            x, y = data(384)
            x_test, y_test = data(96)
            log = io.StringIO()
            result = crucible.train(model, torch.zeros(4, 1, 12, 12), data=(x, y, x_test, y_test),
                                    train__epochs=6, train__batch_size=32, train__precision="fp32", optim__lr=0.01,
                                    log__every_steps=6, stream=log)
            after = {k: v.clone() for k, v in result.model.state_dict().items()}
            moved = {k: float((after[k].float() - before[k].float()).abs().max()) for k in before
                     if before[k].is_floating_point()}
            net = result.model
            net.eval()
            with torch.no_grad():
                logits = net(torch.from_numpy(x_test))
            labels = torch.from_numpy(y_test)
            print(json.dumps({"run_dir": result.run_dir, "summary": result.summary,
                              "lines": log.getvalue().count("\\n"), "moved": moved,
                              "state": {k: v.tolist() for k, v in after.items()},
                              "labels": y_test.tolist(), "pred": logits.argmax(1).tolist(),
                              "prob": torch.softmax(logits.double(), 1).tolist(),
                              "acc": (logits.argmax(1) == labels).double().mean().item(),
                              "loss": F.cross_entropy(logits.double(), labels).item()}))
            """)
        r = run([sys.executable, "-c", script])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        summary, run_dir = out["summary"], out["run_dir"]

        # The returned model holds the file the run wrote, read by a reader that is not crucible's.
        got = read_safetensors_without_crucible(os.path.join(run_dir, "model.safetensors"))
        self.assertEqual(sorted(got), sorted(out["state"]))
        for k, v in out["state"].items():
            self.assertTrue(np.array_equal(np.asarray(v, dtype=got[k].dtype).reshape(got[k].shape), got[k]), k)
        for k in ("0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "6.weight", "6.bias"):
            self.assertGreater(out["moved"][k], 1e-4, f"{k} did not move: {out['moved']}")

        # PyTorch's evaluation of it is the run's: the same accuracy (a count of the 96 samples) and
        # loss (crucible's is a mean over float logits, so to rounding)...
        print(f"\ncrucible.train: PyTorch's evaluation of the returned model: accuracy {out['acc']:.4f} "
              f"(summary {summary['test_acc']:.4f}), loss {out['loss']:.7f} (summary {summary['test_loss']:.7f})")
        self.assertEqual(round(out["acc"] * 96), round(summary["test_acc"] * 96))
        self.assertAlmostEqual(out["acc"], summary["test_acc"], places=12)
        self.assertAlmostEqual(out["loss"], summary["test_loss"], delta=1e-5 * summary["test_loss"])
        self.assertGreater(out["acc"], 0.8, "a trained model tells the stripes apart; chance is 1/3")
        # ... and sample by sample, crucible's predictions of the run's final checkpoint: the same
        # label order, the same top class, the same probabilities.
        preds = os.path.join(run_dir, "predictions.jsonl")
        p = run([CRUCIBLE, "predict", os.path.join(run_dir, "config.toml"), "--top", "3", "--out", preds])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"model of step {summary['steps']} ", p.stdout + p.stderr)
        with open(preds) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([rec["label"] for rec in records], out["labels"])
        self.assertEqual([rec["top"][0] for rec in records], out["pred"])
        worst = max(abs(q - out["prob"][i][c]) for i, rec in enumerate(records) for c, q in zip(rec["top"], rec["prob"]))
        print(f"crucible predict: the same top class for all {len(records)} samples, probabilities within {worst:.2g}")
        self.assertLess(worst, 1e-5, "PyTorch's softmax of the returned model against crucible predict's")

        # The loss fell: the last epoch's mean training loss against the first's (metrics.jsonl).
        epochs = {}
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if rec["type"] == "train":
                    epochs.setdefault(rec["epoch"], []).append(rec["loss"])
        self.assertEqual(sorted(epochs), list(range(6)))
        first, last = np.mean(epochs[0]), np.mean(epochs[5])
        print(f"training loss: first epoch {first:.4f}, last {last:.4f}")
        self.assertLess(last, 0.8 * first)
        self.assertGreater(out["lines"], 5)  # the trainer's progress came through the stream
        self.assertEqual(len(summary["params_sha256"]), 64)

    def test_a_failed_run_raises_with_the_exit_code(self):
        model = nn.Sequential(nn.Flatten(), nn.Linear(144, 3))
        with self.assertRaises(crucible.TrainError) as e:
            crucible.train(model, torch.zeros(4, 1, 12, 12), stream=io.StringIO(), train__epochs=-1)
        self.assertEqual(e.exception.exit_code, 2)
        self.assertIn("train.epochs", str(e.exception))


if __name__ == "__main__":
    unittest.main()
