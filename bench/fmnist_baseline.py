#!/usr/bin/python3
"""The PyTorch baseline of crucible's default job, written as a PyTorch user would.

Same recipe as configs/fashion_mnist.toml: torchvision FashionMNIST (from Debian's
dataset-fashion-mnist .gz files) with RandomHorizontalFlip + ToTensor + Normalize((0.2860,),
(0.3530,)), the fmnist_cnn model (same layers and parameter names as crucible's), AdamW
lr 2e-3 wd 5e-4 (none on biases and BatchNorm weights), OneCycleLR, cross-entropy with label smoothing 0.1, batch 256, evaluation
on the 10,000 test images after every epoch.

Prints one JSON object as its last line: the time to reach --target test accuracy
(training steps + evaluations, no set-up), per-epoch accuracies and throughput. Runs under any
torch: Debian's 1.13 (/usr/bin/python3) or current torch from .venv-torch2, where --compile
wraps the model in torch.compile.
"""
import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

FM = "/usr/share/datasets/fashion-mnist"


class FmnistCnn(nn.Module):
    def __init__(self, dropout=0.25):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(64)
        self.conv4 = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn4 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(3136, 256)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)), inplace=True)
        x = F.relu(self.bn2(self.conv2(x)), inplace=True)
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn3(self.conv3(x)), inplace=True)
        x = F.relu(self.bn4(self.conv4(x)), inplace=True)
        x = F.max_pool2d(x, 2)
        x = F.relu(self.fc1(x.flatten(1)), inplace=True)
        return self.fc2(self.drop(x))


def torchvision_root():
    """torchvision's FashionMNIST wants unpacked files under <root>/FashionMNIST/raw/."""
    root = tempfile.mkdtemp(prefix="fmnist-baseline-")
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        with gzip.open(os.path.join(FM, name + ".gz"), "rb") as src, open(os.path.join(raw, name), "wb") as dst:
            shutil.copyfileobj(src, dst)
    return root


def recipe(model, total_steps):
    """The default job's optimizer, schedule and loss: AdamW lr 2e-3, weight decay 5e-4 except on
    biases and normalisation weights (T4, as crucible's default), OneCycleLR, label smoothing 0.1."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=total_steps, pct_start=0.3)
    return opt, sched, nn.CrossEntropyLoss(label_smoothing=0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.91)
    ap.add_argument("--stop-at-target", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the GPU benchmark in scripts/device-check)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (inductor; its compile time counts, as a user waits for it)")
    args = ap.parse_args()

    # Debian's torch starts with 1 thread; give it every core, as crucible takes them.
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    root = torchvision_root()
    tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize((0.2860,), (0.3530,))])
    tf_eval = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train = datasets.FashionMNIST(root, train=True, transform=tf, download=False)
    test = datasets.FashionMNIST(root, train=False, transform=tf_eval, download=False)
    dev = torch.device(args.device)
    kw = dict(num_workers=args.workers, persistent_workers=args.workers > 0, pin_memory=dev.type == "cuda")
    train_loader = DataLoader(train, batch_size=256, shuffle=True, **kw)
    test_loader = DataLoader(test, batch_size=1000, shuffle=False, **kw)

    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = FmnistCnn().to(dev, memory_format=fmt)
    opt, sched, crit = recipe(model, args.epochs * len(train_loader))
    if args.compile:
        model = torch.compile(model)  # the optimizer holds the same parameters
    amp = args.precision == "bf16"

    train_seconds = 0.0
    step_seconds = 0.0
    samples = 0
    reached = None
    evals = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
            y = y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            samples += x.shape[0]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_seconds += dt
        t1 = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            for x, y in test_loader:
                x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
                correct += (model(x).argmax(1) == y.to(dev)).sum().item()
        acc = correct / len(test)
        train_seconds += dt + time.perf_counter() - t1
        evals.append({"epoch": epoch + 1, "test_acc": acc, "train_seconds": train_seconds})
        print(f"epoch {epoch + 1}: test accuracy {100 * acc:.2f}%  ({train_seconds:.1f} s)", flush=True)
        if reached is None and acc >= args.target:
            reached = train_seconds
            if args.stop_at_target:
                break
    shutil.rmtree(root)
    graphs = None
    if args.compile:  # evidence that inductor really compiled: the graphs dynamo captured
        from torch._dynamo.utils import counters
        graphs = counters["stats"]["unique_graphs"]
    print(json.dumps({"compiled_graphs": graphs, "time_to_target": reached, "target": args.target, "evals": evals,
                      "final_test_acc": evals[-1]["test_acc"], "samples_per_s": samples / step_seconds,
                      "threads": torch.get_num_threads(), "workers": args.workers,
                      "precision": args.precision, "channels_last": args.channels_last, "compile": args.compile,
                      "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
