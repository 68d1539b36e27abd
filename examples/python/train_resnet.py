#!/usr/bin/python3
"""A plain PyTorch training loop (torchvision ResNet-18) fed by crucible.ImageLoader instead of
torch.utils.data.DataLoader. The loop is the user's own; only the loader changes (--loader torch
runs the same loop on ImageFolder + DistributedSampler + DataLoader, for comparison).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/train_resnet.py photos/train \\
        --epochs 1 --crop 128 --batch-size 64
    # data parallel: one process per device (Gloo on CPU, NCCL on GPUs), torchrun's variables
    build/crucible launch --nproc 2 -- /usr/bin/python3 examples/python/train_resnet.py photos/train
    torchrun --nproc-per-node 2 examples/python/train_resnet.py photos/train     # torch 2.x

Debian 12's torchrun (torch 1.13 under Python 3.11) fails inside its own elastic agent
(AttributeError: 'NoneType' object has no attribute 'get', in elastic/multiprocessing/api.py):
there, use `crucible launch`, which sets the same variables.

Prints images/s per epoch (rank 0); `--json` ends with one JSON line of the figures.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torchvision


def torch_loader(root, batch_size, crop, seed, workers):
    """The DataLoader a PyTorch user writes for the same job."""
    t = torchvision.transforms
    ds = torchvision.datasets.ImageFolder(root, t.Compose([t.RandomResizedCrop(crop), t.RandomHorizontalFlip(),
                                                          t.PILToTensor()]))
    sampler = torch.utils.data.DistributedSampler(ds, shuffle=True, seed=seed) if dist.is_initialized() else None
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                                         num_workers=workers, pin_memory=torch.cuda.is_available(),
                                         persistent_workers=workers > 0)
    return loader, sampler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="an image folder (one sub-folder per class), or anything crucible reads")
    ap.add_argument("--loader", choices=["crucible", "torch"], default="crucible")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=None, help="crucible loader threads (default: measured)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (--loader torch)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop an epoch after this many steps (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(a.seed)

    if a.loader == "crucible":
        import crucible
        # rank and world_size come from torch.distributed; the shards equal DistributedSampler's.
        loader = crucible.ImageLoader(a.data, batch_size=a.batch_size, crop=a.crop, train=True, seed=a.seed,
                                      threads=a.threads)
        sampler = loader
        classes = None
    else:
        loader, sampler = torch_loader(a.data, a.batch_size, a.crop, a.seed, a.workers)
        classes = len(loader.dataset.classes)
    if classes is None:
        classes = len([d for d in os.listdir(a.data) if os.path.isdir(os.path.join(a.data, d))]) or 1000

    model = torchvision.models.resnet18(num_classes=classes).to(device).to(memory_format=torch.channels_last)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                          else None)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    loss_fn = torch.nn.CrossEntropyLoss()

    results = []
    for epoch in range(a.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        images, loss_sum, t0 = 0, torch.zeros((), device=device), time.perf_counter()
        for step, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True).float().sub_(mean).div_(std).contiguous(
                memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            images += x.shape[0]
            if a.max_steps and step + 1 >= a.max_steps:
                break
        seconds = time.perf_counter() - t0
        r = {"epoch": epoch, "images": images, "seconds": seconds, "images_per_s": images / seconds,
             "loss": loss_sum.item() / max(1, step + 1)}
        results.append(r)
        if rank == 0:
            print(f"epoch {epoch}: {images} images in {seconds:.1f} s, {r['images_per_s']:.1f} images/s per rank, "
                  f"mean loss {r['loss']:.4f} ({a.loader} loader)", flush=True)
    if a.json and rank == 0:
        print(json.dumps({"loader": a.loader, "epochs": results}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
