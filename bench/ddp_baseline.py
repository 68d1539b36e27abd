#!/usr/bin/python3
"""PyTorch DistributedDataParallel on CPU (Gloo) for crucible's default job, as a PyTorch user
would write it; run under torchrun or `crucible launch --nproc N -- /usr/bin/python3 bench/ddp_baseline.py`.

Each rank: torchvision FashionMNIST + DistributedSampler(seed 0, set_epoch) + DataLoader
(batch 256 per rank, num_workers 0), fmnist_cnn wrapped in DDP (broadcast_buffers, bucket 25 MiB),
AdamW + OneCycleLR, bf16 autocast + channels_last, one compute thread per rank (the machine's
cores shared by its ranks). Trains --epochs epochs; rank 0 prints one JSON line: training
samples per second (all ranks, steps only, first --warmup steps excluded) and test accuracy
from an evaluation gathered over all ranks.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fmnist_baseline import FmnistCnn, recipe, torchvision_root  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP model (current torch)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, os.cpu_count() // local_world))
    torch.manual_seed(0)
    root = torchvision_root()
    tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize((0.2860,), (0.3530,))])
    tf_eval = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train = datasets.FashionMNIST(root, train=True, transform=tf, download=False)
    test = datasets.FashionMNIST(root, train=False, transform=tf_eval, download=False)
    sampler = DistributedSampler(train, seed=0)
    loader = DataLoader(train, batch_size=256, sampler=sampler)
    test_loader = DataLoader(test, batch_size=1000, sampler=DistributedSampler(test, shuffle=False))

    model = FmnistCnn().to(memory_format=torch.channels_last)
    model = nn.parallel.DistributedDataParallel(model)
    opt, sched, crit = recipe(model, args.epochs * len(loader))
    if args.compile:
        model = torch.compile(model)  # compiled in the first steps, which --warmup leaves out
    step, samples, seconds = 0, 0, 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t = time.perf_counter()
        for x, y in loader:
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            now = time.perf_counter()
            if step > args.warmup:
                samples += x.shape[0] * world
                seconds += now - t
            t = now
    model.eval()
    correct = torch.zeros(1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x, y in test_loader:  # padded shards: counts a few samples twice, as PyTorch users do
            correct += (model(x.contiguous(memory_format=torch.channels_last)).argmax(1) == y).sum()
    dist.all_reduce(correct)
    if rank == 0:
        print(json.dumps({"samples_per_s": samples / seconds, "steps": step, "world": world,
                          "test_acc": correct.item() / len(test), "threads": torch.get_num_threads(),
                          "torch_version": torch.__version__, "compile": args.compile}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
