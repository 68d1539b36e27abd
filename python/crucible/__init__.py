"""crucible for PyTorch training loops: its data loader and its array io, as torch tensors.

    import crucible
    loader = crucible.ImageLoader("photos/train", batch_size=128, crop=224, train=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:      # uint8 [N, 3, 224, 224], int64 [N]
            ...

Batches are built by crucible's threads (no fork, no pickling) and are identical for any
thread count; the order and the shards equal torch's DistributedSampler (X1). The tensors are
the loader's own batch memory (no copy), kept alive by the tensors themselves. `load` reads
npy, npz, safetensors and .pt files (a pickle that would run code is refused, naming what it
calls) into tensors viewing the file's memory map where the format allows.

A model defined in Python trains in crucible's C++ trainer through torch.export (torch >= 2.6):
`crucible.export(model, example, "net.pt2")` for `model.name = "exported"`, or
`crucible.train(model, example, data=(x, y, x_test, y_test), train__epochs=3)` for the whole
run, which returns the summary and the model with the trained weights (exported.py).
"""
import json as _json
import warnings as _warnings

import torch
from torch.utils import dlpack as _dlpack

from . import _native
from . import transforms
from .exported import export, load_exported, train, TrainResult, TrainError

__version__ = _native.version
__all__ = ["ImageLoader", "ArrayLoader", "load", "save", "transforms", "export", "load_exported", "train",
           "TrainResult", "TrainError", "release_host_memory"]


def _tensor(capsule):
    return _dlpack.from_dlpack(capsule)


def _detection_batch(images, det, channels_last):
    """A detection batch as torchvision's detection models take one: the images, each a view of
    its own [C, h, w] (or [h, w, C]) inside the padded batch (no copy), and a target dict per
    image: boxes ([n, 4] float32, XYXY pixels), labels ([n] int64, 0 … classes-1), iscrowd and
    image_id."""
    sizes = _tensor(det["sizes"]).tolist()
    offsets = _tensor(det["offsets"]).tolist()
    boxes, labels = _tensor(det["boxes"]), _tensor(det["labels"])
    crowd, ids = _tensor(det["iscrowd"]), _tensor(det["image_ids"]).tolist()
    views, targets = [], []
    for i, (h, w) in enumerate(sizes):
        views.append(images[i, :h, :w, :] if channels_last else images[i, :, :h, :w])
        a, b = offsets[i], offsets[i + 1]
        targets.append({"boxes": boxes[a:b], "labels": labels[a:b], "iscrowd": crowd[a:b].to(torch.int64),
                        "image_id": ids[i]})
    return views, targets


def _distributed():
    """(rank, world_size) of torch.distributed when it is initialised, else (0, 1)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1



def _toml_value(v):
    """A Python value as the TOML text a --set override takes: a bool as true/false, a list or
    tuple as an array, an enum (torchvision's InterpolationMode, AutoAugmentPolicy) as its value."""
    v = getattr(v, "value", v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)

class _Loader:
    """What ImageLoader and ArrayLoader share: iteration, epochs, state, layout and conversion."""

    # Tests: batches go into torch-allocated buffers even without CUDA (the pinned path's
    # mechanism, unpinned), so the CPU machines check it.
    _given_buffers_on_cpu = False

    def _setup(self, make, a, *, epoch, dtype, mean, std, pin_memory):
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        elif pin_memory and not torch.cuda.is_available():
            raise ValueError(f"{type(self).__name__}: pin_memory=True needs CUDA, and "
                             "torch.cuda.is_available() is False here (leave pin_memory=None: pinned when CUDA is there)")
        self.pin_memory = bool(pin_memory)
        # D9: with CUDA, batches are assembled straight into pinned memory torch allocated (no
        # copy on arrival; torch's caching host allocator keeps a buffer from reuse while a
        # non_blocking copy from it is in flight).
        a.given_buffers = self.pin_memory or self._given_buffers_on_cpu
        self._buffers = {}        # id → torch buffer given to the native loader, not yet back
        self._given_ptrs = set()  # addresses of every buffer given (tests)
        self._next_id = 0
        self._native = make(a)
        self.batch_size = a.batch_size
        self.rank, self.world_size, self.seed = a.rank, a.world_size, self._native.seed()
        # Every [data] key and run.seed with the value this loader runs with; the keys given that
        # it does not apply, with why (each said once, as a warning).
        self.settings = _json.loads(self._native.settings_json())
        self.not_applied = dict(self._native.not_applied())
        for key, why in self.not_applied.items():
            _warnings.warn(f"{type(self).__name__}: {key} = {_json.dumps(self.settings[key])} is not applied: {why}",
                           stacklevel=3)
        self.layout = "NCHW" if a.nchw else "NHWC"
        self.epoch = int(epoch)
        self._resume = 0          # the batch the next pass starts at (load_state_dict)
        self._position = None     # (epoch, batches done) while a pass is under way
        self.skipped = []         # "name: reason" of samples left out (bad_samples="skip")
        self._dtype = dtype
        self._mean = self._std = None
        if mean is not None:
            shape = (1, -1, 1, 1) if a.nchw else (1, 1, 1, -1)
            self._mean = torch.tensor(mean, dtype=dtype).reshape(shape)
            self._std = torch.tensor(std, dtype=dtype).reshape(shape)

    @staticmethod
    def _args(batch_size, rank, world_size, layout, drop_last, dtype, mean, std, what):
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"{what}: layout must be 'NCHW' or 'NHWC' (found {layout!r})")
        if (mean is None) != (std is None):
            raise ValueError(f"{what}: give mean and std together")
        if mean is not None and dtype is None:
            raise ValueError(f"{what}: mean/std normalise float images: give dtype=torch.float32 too")
        if rank is None or world_size is None:
            r, w = _distributed()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        a = _native.LoaderArgs()
        a.batch_size = int(batch_size)
        a.rank = int(rank)
        a.world_size = int(world_size)
        a.drop_last = bool(drop_last)
        a.nchw = layout == "NCHW"
        return a

    @staticmethod
    def _augment_options(augment, augment_options):
        """(keyword as given, data.* assignment) for augment="trivialaugment_wide" (etc.) and its
        torchvision options.

        The keywords and the keys they set come from the piece's own declaration
        (src/data/transforms/augment.cpp, each key's torchvision name): nothing is mapped here."""
        if augment is None:
            if augment_options:
                raise ValueError("augment_options without augment: name the augmentation too")
            return []
        keys = dict(_native.piece_arguments("augment"))
        out = [(f"augment={augment}", f"data.augment={augment}")]
        for k, v in (augment_options or {}).items():
            if k not in keys:
                raise ValueError(f"augment_options: unknown option {k!r} (known: {', '.join(keys)})")
            out.append((f"augment_options[{k!r}]={v!r}", f"{keys[k]}={_toml_value(v)}"))
        return out

    @staticmethod
    def _keywords(**given):
        """(keyword as given, assignment) of each keyword given (not None), from name=(key, value):
        crop=("data.crop", 96) gives ("crop=96", "data.crop=96")."""
        return [(f"{name}={value!r}", f"{key}={_toml_value(value)}")
                for name, (key, value) in given.items() if value is not None]

    @staticmethod
    def _settings(settings):
        """settings= as the overrides the native loader takes: "data.key=value", "run.seed=N"."""
        return [f"{k}={_toml_value(v)}" for k, v in (settings or {}).items()]

    def __len__(self):
        return self._native.batches_per_epoch()

    @property
    def threads(self):
        return self._native.threads()

    @property
    def classes(self):
        """The class names by label, where the data name them (detection sets: COCO's categories, YOLO's classes.txt)."""
        return self._native.class_names()

    @property
    def category_ids(self):
        """Detection: each label's id in the source (COCO's category_id, which predictions are written back in)."""
        return self._native.category_ids()

    def describe(self):
        """One line on what is read: the source (its shards, remote or local), the samples, the pipeline."""
        return self._native.describe()

    def close(self):
        """Stops the loader's threads now (dropping the last reference does the same)."""
        self._native = None      # first: its workers stop writing into the buffers
        self._buffers = {}

    def __del__(self):
        # The native loader first: its workers may be writing into the given buffers, which the
        # instance's dict could otherwise free before it.
        self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        self._resume = 0

    def __iter__(self):
        return self.batches()

    def batches(self, epoch=None):
        """The batches of `epoch` (default: the current one, from a resumed position if any)."""
        if self._native is None:
            raise ValueError(f"{type(self).__name__}: closed")
        e = self.epoch if epoch is None else int(epoch)
        start = self._resume if e == self.epoch else 0
        self._resume = 0
        self._top_up()
        self._native.start(e, start)
        self._position = (e, start)
        while True:
            self._top_up()
            got = self._native.next()
            if got is None:
                break
            images, labels, index, skipped, buffer = got[:5]
            self._position = (e, index + 1)
            self.skipped.extend(skipped)
            images = self._images(self._arrived(_tensor(images), buffer))
            if len(got) == 6:
                yield _detection_batch(images, got[5], channels_last=self.layout == "NHWC")
            else:
                yield images, _tensor(labels)
        self._position = None
        self.epoch = e + 1

    def _top_up(self):
        """Gives the native loader enough batch buffers that no worker goes without one."""
        n = self._native
        if not self.pin_memory and not self._given_buffers_on_cpu:
            return
        for i in n.released():   # buffers of batches dropped unseen (an epoch restarted)
            self._buffers.pop(i, None)
        nbytes = n.batch_bytes()
        if nbytes == 0:          # detection: batches as large as their images, on the heap
            return
        for _ in range(n.prefetch() + 1 - n.free_buffers()):
            t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)
            self._next_id += 1
            self._buffers[self._next_id] = t
            self._given_ptrs.add(t.data_ptr())
            n.give(t.data_ptr(), nbytes, self._next_id)

    def _arrived(self, x, buffer):
        """The batch as a tensor of the torch buffer it was built in (or as it came)."""
        if buffer >= 0:
            b = self._buffers.pop(buffer)
            return b[:x.numel() * x.element_size()].view(x.dtype).view(x.shape)
        if self.pin_memory:  # no buffer was free when the batch began (a race): copy it in
            return x.pin_memory()
        return x

    def _images(self, x):
        if self._dtype is None or x.dtype != torch.uint8:
            return x
        x = x.to(self._dtype).div_(255)
        if self._mean is not None:
            x.sub_(self._mean).div_(self._std)
        return x

    def state_dict(self):
        epoch, batch = self._position if self._position is not None else (self.epoch, self._resume)
        return {"epoch": epoch, "batch": batch, "batch_size": self.batch_size, "seed": self.seed,
                "rank": self.rank, "world_size": self.world_size,
                "dataset_size": self._native.dataset_size()}

    def load_state_dict(self, state):
        name = type(self).__name__
        for key in ("batch_size", "seed", "world_size", "dataset_size"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(f"{name}.load_state_dict: the state is of a loader with {key} "
                                 f"{state[key]}, this one has {mine}: the remaining batches would differ")
        batches = len(self)
        if not 0 <= int(state["batch"]) <= batches:
            raise ValueError(f"{name}.load_state_dict: batch {state['batch']} is outside the epoch's "
                             f"{batches} batches")
        self.epoch = int(state["epoch"])
        self._resume = int(state["batch"])
        self._position = None


class ImageLoader(_Loader):
    """Batches of (images, labels) from an image folder, tar shards, an LMDB folder, packed shards
    (`crucible pack`) or a folder of IDX files — or shards behind URLs: "s3://bucket/train-{000..127}.tar",
    "https://host/set/index.crpk", read through the node's shard cache (settings "data.cache_dir",
    "data.cache_bytes", "data.s3_endpoint", … as for `crucible train`; credentials as the AWS tools find
    them). Training order: data.sampler ("auto": the global order, shard windows, for URLs; PyTorch's
    DistributedSampler for local data).

    Detection (settings={"data.dataset": "detection"}, source a COCO instances .json or a YOLO
    images folder): batches are (images, targets) as torchvision's detection models take them:
    each image a view of its own size inside the padded batch, each target a dict of "boxes"
    ([n, 4] float32 XYXY pixels), "labels" (int64, 0 … classes-1), "iscrowd" and "image_id";
    training runs data.detection_preset's transforms (torchvision's references presets).

    Training (train=True): RandomResizedCrop to `crop` and a horizontal flip, shuffled each epoch;
    evaluation: resize and centre crop, in order (crop=None: data.crop, 224 unless settings give
    it). Images are uint8 in 0–255, NCHW (or NHWC with layout="NHWC"); with dtype=torch.float32 they are scaled to 0–1 and, with mean and std (in
    0–1 units, one per channel), normalised (D4). Labels are int64 class indices.

    rank and world_size default to torch.distributed's when it is initialised; each rank gets
    DistributedSampler's shard (padded to equal length, drop_last=False there). drop_last drops a
    final partial batch. threads=None measures the best count (D10). cache: "none", "encoded" or
    "decoded" (data.cache). bad_samples: "fail" (a bad file raises ValueError naming it) or "skip"
    (left out of its batch and named in `skipped`). augment: "randaugment", "trivialaugment_wide",
    "autoaugment" or "augmix" after the crop and flip (torchvision's v2 transforms, on the loader
    threads), augment_options their torchvision arguments ({"num_ops": 2, "magnitude": 9,
    "num_magnitude_bins": 31, "policy": "imagenet", "interpolation": "bilinear", "fill": [0],
    "severity": 3, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "all_ops": True}).
    settings: any crucible data.* key and run.seed, e.g. {"data.prefetch": 8}: they win over the
    keywords left at None, a keyword given that they contradict raises ValueError naming both, and
    a key this loader cannot apply (data.random_erase: training's, on the device) is named in
    `not_applied` and warned of; `settings` holds every key's value as run. pin_memory: None pins
    when CUDA is available (D9: each batch is built straight into pinned memory torch allocated,
    ready for .cuda(non_blocking=True)).

    The epoch is set_epoch()'s, or advances by itself after each full pass; state_dict() and
    load_state_dict() resume in mid-epoch with the same remaining batches.
    """

    def __init__(self, source, *, batch_size, crop=None, train=True, seed=None, rank=None, world_size=None,
                 threads=None, cache=None, bad_samples=None, layout="NCHW", drop_last=False, epoch=0,
                 dtype=None, mean=None, std=None, settings=None, pin_memory=None, augment=None,
                 augment_options=None):
        a = self._args(batch_size, rank, world_size, layout, drop_last, dtype, mean, std, "ImageLoader")
        a.source = str(source)
        a.train = bool(train)
        a.overrides = self._settings(settings)
        a.options = self._keywords(crop=("data.crop", crop), seed=("run.seed", seed), threads=("data.threads", threads),
                                   cache=("data.cache", cache), bad_samples=("data.bad_samples", bad_samples)) + \
            self._augment_options(augment, augment_options)
        self._setup(_native.Loader.images, a, epoch=epoch, dtype=dtype, mean=mean, std=std, pin_memory=pin_memory)


class ArrayLoader(_Loader):
    """Batches of (features, labels) from array files, memory-mapped (D13): `features` an .npy,
    .npz member ("data.npz:x") or safetensors entry of uint8 images [N, H, W(, C)] or float
    features [N, C, H, W] (or [N, D]); `labels` integer class indices [N] or 0–1 targets
    [N, classes] (multi-label: the labels come as float targets). shuffle=True reshuffles each
    epoch; hflip flips uint8 images with that probability (None: settings' data.hflip, else 0),
    then augment/augment_options as ImageLoader's. Images come as ImageLoader's (uint8, NCHW or
    NHWC, dtype/mean/std to convert); float features as stored. rank, world_size, threads,
    drop_last, pin_memory, epochs, state and settings as ImageLoader.
    """

    def __init__(self, features, labels, *, batch_size, shuffle=True, seed=None, rank=None, world_size=None,
                 threads=None, hflip=None, layout="NCHW", drop_last=False, epoch=0, dtype=None, mean=None,
                 std=None, pin_memory=None, augment=None, augment_options=None, settings=None):
        a = self._args(batch_size, rank, world_size, layout, drop_last, dtype, mean, std, "ArrayLoader")
        a.features = str(features)
        a.labels = str(labels)
        a.train = bool(shuffle)
        a.defaults = ["data.hflip=0.0"]  # ArrayLoader's own: no flip unless asked
        a.overrides = self._settings(settings)
        a.options = self._keywords(seed=("run.seed", seed), threads=("data.threads", threads),
                                   hflip=("data.hflip", None if hflip is None else float(hflip))) + \
            self._augment_options(augment, augment_options)
        self._setup(_native.Loader.arrays, a, epoch=epoch, dtype=dtype, mean=mean, std=std, pin_memory=pin_memory)


def release_host_memory():
    """Hands the freed heap that glibc keeps back to the kernel (malloc_trim): a loader tunes
    glibc's allocator, for the whole process, to keep freed blocks up to 32 MiB for the next
    batch, as the crucible program does. Returns the resident bytes that went (0 without glibc)."""
    return _native.release_host_memory()


def load(path):
    """{name: tensor} of an npy, npz, safetensors or .pt file (format from the content, not the
    name). Arrays view the file's memory map where the format stores them uncompressed."""
    arrays, dtypes, _ = _native.load(str(path))
    out = {}
    for name, capsule in arrays.items():
        t = _tensor(capsule)
        if dtypes[name] == "bool":
            t = t.view(torch.bool)
        out[name] = t
    return out


_DTYPE_NAMES = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
                torch.int32: "int32", torch.int64: "int64", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.float32: "float32", torch.float64: "float64", torch.complex64: "complex64",
                torch.complex128: "complex128"}


def save(path, tensors):
    """Writes {name: tensor} to `path`: .safetensors, .npz, or .npy (exactly one tensor), by the
    extension; atomically (after an error nothing is left at `path`). Tensors on a device are
    copied to the host first; views are written as their own elements."""
    items = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"crucible.save {path}: {name!r} is a {type(t).__name__}, not a tensor")
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"crucible.save {path}: {name!r} has dtype {t.dtype}, which these formats cannot hold")
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() and flat.dtype != torch.uint8 else flat.to(torch.uint8)
        items.append((name, _DTYPE_NAMES[t.dtype], list(t.shape), raw.numpy()))
    _native.save(str(path), items)
