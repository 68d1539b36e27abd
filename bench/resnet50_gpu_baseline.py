#!/usr/bin/env python3
"""PyTorch's side of bench/resnet50_gpu (issue 38, P4): ResNet-50 training steps, bf16 autocast,
channels_last, SGD with momentum, on 224 px RandomResizedCrop + flip crops of JPEG photos, as a
PyTorch user writes it. One of three input modes:

  --mode synthetic   the step alone on one batch held on the device: the ceiling
  --mode dataloader  ImageFolder (PIL decode) + transforms.v2 RandomResizedCrop, flip, ToDtype,
                     Normalize in DataLoader worker processes, pin_memory, .to(non_blocking)
  --mode gpudecode   DataLoader workers read the files' bytes; the main process decodes the batch
                     on the GPU with torchvision.io.decode_jpeg(device="cuda") (nvJPEG), then
                     RandomResizedCrop, flip and Normalize on the GPU per image

Warm-up steps (cuDNN autotuning, workers starting) are not timed; the timed window starts and
ends with a device synchronisation. Prints one JSON object as its last line: images/s, the share
of the timed window the host spent waiting for input (inside next(loader) and the decode), the
device's peak memory, versions.
"""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, models
from torchvision.transforms import v2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class JpegBytes(Dataset):
    """The folder's files as raw bytes (uint8 tensors) and their class: decoding happens later, on the GPU."""

    def __init__(self, root):
        self.items = datasets.ImageFolder(root).samples

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from torchvision.io import read_file
        path, label = self.items[i]
        return read_file(path), label


def bytes_collate(batch):
    """One tensor of all the files' bytes and their lengths: a list of small tensors would cross
    from the worker processes one file descriptor each (and run out of them)."""
    return (torch.cat([b for b, _ in batch]), torch.tensor([b.numel() for b, _ in batch]),
            torch.tensor([label for _, label in batch]))


def forever(loader):
    while True:
        yield from loader


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="an ImageFolder (class folders of JPEGs)")
    ap.add_argument("--mode", choices=["synthetic", "dataloader", "gpudecode"], required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()

    dev = torch.device(args.device)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = getattr(models, args.model)(num_classes=args.classes).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)

    def step(x, y):
        with amp:
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if args.mode == "synthetic":
        x = torch.randn(args.batch, 3, args.crop, args.crop, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, args.classes, (args.batch,), device=dev)
        batches = iter(lambda: (x, y), None)
    elif args.mode == "dataloader":
        tf = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
        data = datasets.ImageFolder(args.data, transform=tf)
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers, pin_memory=dev.type == "cuda",
                            drop_last=True, persistent_workers=args.workers > 0,
                            prefetch_factor=4 if args.workers > 0 else None)
        host = forever(loader)
        batches = ((x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last), y.to(dev, non_blocking=True))
                   for x, y in host)
    else:
        from torchvision.io import decode_jpeg, ImageReadMode
        crop = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True), v2.RandomHorizontalFlip()])
        data = JpegBytes(args.data)
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers, drop_last=True,
                            collate_fn=bytes_collate, persistent_workers=args.workers > 0,
                            prefetch_factor=4 if args.workers > 0 else None)

        def gpu_batches():
            for raw, lengths, y in forever(loader):
                files = list(torch.split(raw, lengths.tolist()))
                images = decode_jpeg(files, mode=ImageReadMode.RGB, device=dev)  # one batched nvJPEG call
                x = torch.stack([crop(im) for im in images]).float().div_(255)
                x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
                yield x, y.to(dev, non_blocking=True)

        batches = gpu_batches()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step(*next(batches))
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        w0 = time.perf_counter()
        x, y = next(batches)
        waited += time.perf_counter() - w0
        step(x, y)
    sync()
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "mode": args.mode, "images_per_s": args.steps * args.batch / seconds, "seconds": seconds, "steps": args.steps,
        "batch": args.batch, "host_input_share": waited / seconds,
        "device_peak_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else 0,
        "torch_version": torch.__version__, "workers": args.workers}))


if __name__ == "__main__":
    main()
