#!/usr/bin/python3
"""The PyTorch baseline of configs/photos_resnet18.toml, written as a PyTorch user would.

torchvision's resnet18 (num_classes from the folder) on an ImageFolder of JPEGs: training with
RandomResizedCrop(128) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet), evaluation with
Resize(int(128 / 0.875)) + CenterCrop(128), through torch.utils.data.DataLoader (batch 64,
shuffled, --workers processes, persistent). SGD with Nesterov momentum 0.9, lr 0.2 * 64 / 256,
weight decay 1e-4 except on biases and BatchNorm weights (as crucible's default, T4),
OneCycleLR (pct_start 0.2, momentum cycled 0.95-0.85), cross-entropy with label smoothing 0.1,
bf16 autocast + channels_last, evaluation on the test folder after every epoch.

Prints one JSON object as its last line: training images/s (steps with their input, no
evaluation), per-epoch test accuracy, and the CPU time spent producing input against all CPU
time of training (main process + DataLoader workers): with workers, their CPU time; without,
the main thread's CPU time inside next(loader).

With --recipe (torchvision >= 0.16: transforms.v2) it trains torchvision's modern recipe as
references/classification/train.py builds it: ClassificationPresetTrain's RandomResizedCrop, flip,
TrivialAugmentWide (bilinear), PILToTensor, ToDtype, Normalize, RandomErasing(0.1); a collate_fn
with RandomChoice([MixUp(0.2), CutMix(1.0)]); label smoothing 0.1 over the soft targets; and
utils.ExponentialMovingAverage (AveragedModel with buffers) updated every --ema-steps iterations
with the decay adjusted as train.py adjusts it, evaluated after every epoch beside the model.

With --synthetic it times the same training step on one batch held in memory instead (no input
at all, no evaluation): the compute ceiling that no input pipeline can pass on this machine.
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """utime + stime of one process, in seconds (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def worker_pids(it):
    return [w.pid for w in getattr(it, "_workers", [])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="folder with train/ and test/ ImageFolders")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--synthetic", action="store_true", help="time the step alone, on a batch held in memory")
    ap.add_argument("--recipe", action="store_true", help="TrivialAugment, random erasing, MixUp/CutMix, EMA")
    ap.add_argument("--ema-steps", type=int, default=1)
    ap.add_argument("--ema-decay", type=float, default=0.998)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)  # Debian's torch starts with 1 thread; crucible takes every core
    torch.manual_seed(args.seed)
    norm = transforms.Normalize(MEAN, STD)
    tf = transforms.Compose([transforms.RandomResizedCrop(args.crop), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), norm])
    tf_eval = transforms.Compose([transforms.Resize(int(args.crop / 0.875)), transforms.CenterCrop(args.crop),
                                  transforms.ToTensor(), norm])
    collate = None
    if args.recipe:
        from torchvision.transforms import v2
        tf = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True), v2.RandomHorizontalFlip(),
                         v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR), v2.PILToTensor(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD), v2.RandomErasing(0.1)])
        classes = len(datasets.ImageFolder(os.path.join(args.data, "train")).classes)
        collate = MixUpCutMixCollate(classes)
    train = datasets.ImageFolder(os.path.join(args.data, "train"), transform=tf)
    test = datasets.ImageFolder(os.path.join(args.data, "test"), transform=tf_eval)
    dev = torch.device(args.device)
    kw = dict(num_workers=args.workers, persistent_workers=args.workers > 0, pin_memory=dev.type == "cuda")
    train_loader = DataLoader(train, batch_size=args.batch, shuffle=True, collate_fn=collate, **kw)
    test_loader = DataLoader(test, batch_size=2 * args.batch, shuffle=False, **kw)

    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = models.resnet18(num_classes=len(train.classes)).to(dev, memory_format=fmt)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    lr = 0.2 * args.batch / 256
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=lr, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=args.epochs * len(train_loader),
                                                pct_start=0.2)
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)
    amp = args.precision == "bf16"
    ema = None
    if args.recipe:
        # train.py: adjust = world_size * batch_size * model_ema_steps / epochs; alpha = min(1, (1 - decay) * adjust)
        alpha = min(1.0, (1.0 - args.ema_decay) * args.batch * args.ema_steps / args.epochs)
        ema = ExponentialMovingAverage(model, 1.0 - alpha, dev)

    if args.synthetic:
        synthetic(args, model, opt, sched, crit, fmt, dev, amp, len(train.classes), len(train_loader))
        return

    step_seconds = input_cpu = total_cpu = train_seconds = 0.0
    samples = iteration = 0
    evals = []
    it = iter(train_loader)  # persistent: the same workers every epoch
    for epoch in range(args.epochs):
        model.train()
        if epoch > 0:
            it = iter(train_loader)
        pids = worker_pids(it)
        w0 = {p: proc_cpu(p) for p in pids}
        c0, t0 = time.process_time(), time.perf_counter()
        fetch_cpu = 0.0
        while True:
            f0 = time.thread_time()
            try:
                x, y = next(it)
            except StopIteration:
                break
            fetch_cpu += time.thread_time() - f0
            x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
            y = y.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if ema is not None and iteration % args.ema_steps == 0:
                ema.update_parameters(model)
            iteration += 1
            samples += x.shape[0]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        main_cpu = time.process_time() - c0
        workers_cpu = sum(proc_cpu(p) - w0[p] for p in pids)
        input_cpu += workers_cpu if pids else fetch_cpu
        total_cpu += main_cpu + workers_cpu
        step_seconds += dt
        t1 = time.perf_counter()
        acc = evaluate(model, test_loader, dev, fmt, amp) / len(test)
        acc_ema = evaluate(ema.module, test_loader, dev, fmt, amp) / len(test) if ema is not None else None
        train_seconds += dt + time.perf_counter() - t1
        evals.append({"epoch": epoch + 1, "test_acc": acc, "test_acc_ema": acc_ema, "train_seconds": train_seconds})
        print(f"epoch {epoch + 1}: test accuracy {100 * acc:.2f}%"
              f"{'' if acc_ema is None else f' (EMA {100 * acc_ema:.2f}%)'}  ({train_seconds:.1f} s, "
              f"{samples / step_seconds:.1f} images/s)", flush=True)
    print(json.dumps({"evals": evals, "final_test_acc": evals[-1]["test_acc"],
                      "final_test_acc_ema": evals[-1]["test_acc_ema"], "images_per_s": samples / step_seconds,
                      "train_seconds": train_seconds, "input_cpu_share": input_cpu / total_cpu if total_cpu else None,
                      "threads": torch.get_num_threads(), "workers": args.workers, "precision": args.precision,
                      "channels_last": args.channels_last, "torch_version": torch.__version__}))


def evaluate(model, loader, dev, fmt, amp):
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        for x, y in loader:
            x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
            correct += (model(x).argmax(1) == y.to(dev)).sum().item()
    return correct


class MixUpCutMixCollate:
    """train.py's collate_fn: default_collate, then RandomChoice([MixUp, CutMix]) (picklable for workers)."""

    def __init__(self, classes):
        from torchvision.transforms import v2
        self.mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])

    def __call__(self, batch):
        from torch.utils.data import default_collate
        return self.mix(*default_collate(batch))


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """references/classification/utils.py's ExponentialMovingAverage."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def synthetic(args, model, opt, sched, crit, fmt, dev, amp, classes, steps):
    """One epoch's worth of steps on a fixed random batch, after 3 warm-up steps (X9)."""
    x = torch.randn(args.batch, 3, args.crop, args.crop, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (args.batch,), device=dev)
    model.train()
    for i in range(steps + 3):
        if i == 3:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rate = steps * args.batch / (time.perf_counter() - t0)
    print(json.dumps({"images_per_s": rate, "steps": steps, "synthetic": True, "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
