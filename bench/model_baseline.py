#!/usr/bin/python3
"""PyTorch's side of bench/model_vs_pytorch: torchvision's resnet18 (or another torchvision
classifier) timed as `crucible bench model` times crucible's — forward alone (eval mode, no
autograd) and the whole training step (forward, cross-entropy with label smoothing 0.1, backward,
SGD with Nesterov momentum) — for each precision and memory format, warm-up runs excluded,
median and p90 of the counted runs. Prints one JSON object.

    model_baseline.py --model resnet18 --batch 32 --size 128 --classes 10 [--warmup 3] [--repeats 20]
                      [--seconds 10] [--precisions fp32,bf16] [--threads N]
"""
import argparse
import json
import time

import numpy as np
import torch
import torchvision


def measure(once, warmup, repeats, seconds):
    for _ in range(warmup):
        once()
    ms = []
    start = time.perf_counter()
    while len(ms) < repeats and (len(ms) < 3 or time.perf_counter() - start < seconds):
        t0 = time.perf_counter()
        once()
        ms.append(1000 * (time.perf_counter() - t0))
    return {"runs": len(ms), "median_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "min_ms": min(ms)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x32 = torch.randn(a.batch, 3, a.size, a.size)
    y = torch.randint(0, a.classes, (a.batch,))
    rows = []
    for precision in a.precisions.split(","):
        for fmt in ("contiguous", "channels_last"):
            mf = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
            amp = precision == "bf16"
            x = x32.contiguous(memory_format=mf)
            model = getattr(torchvision.models, a.model)(num_classes=a.classes).to(memory_format=mf)
            model.eval()

            def forward():
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    model(x)

            r = measure(forward, a.warmup, a.repeats, a.seconds)
            rows.append(dict(r, precision=precision, memory_format=fmt, what="forward"))
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
            loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

            def step():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss.item()  # the step's one host read, as crucible's finiteness check

            r = measure(step, a.warmup, a.repeats, a.seconds)
            rows.append(dict(r, precision=precision, memory_format=fmt, what="train_step"))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
