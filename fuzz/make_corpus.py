#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): small valid files of
every kind each parser reads, written by NumPy and PyTorch themselves. Run once; the output
is checked in so CI needs no generation step."""
import gzip, io, json, os, struct, sys, zipfile
import numpy as np

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy_bytes(a, version=None):
    b = io.BytesIO()
    np.lib.format.write_array(b, a, version=version)
    return b.getvalue()


arrays = {
    "f4": np.arange(6, dtype="<f4").reshape(2, 3),
    "f8be": np.arange(4, dtype=">f8"),
    "fortran": np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3)),
    "bool": np.array([True, False, True]),
    "u2": np.arange(3, dtype="<u2"),
    "c8": np.arange(2, dtype="<c8"),
    "scalar": np.array(3.5),
    "empty": np.zeros((0, 2), dtype="<f2"),
}
for name, a in arrays.items():
    put("npy", name + ".npy", npy_bytes(a))
put("npy", "v2.npy", npy_bytes(arrays["f4"], (2, 0)))
put("npy", "v3.npy", npy_bytes(arrays["f4"], (3, 0)))

for name, compress in (("stored", False), ("deflated", True)):
    b = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(b, a=arrays["f4"], b=arrays["bool"])
    put("npz", name + ".npz", b.getvalue())

def idx(a, code):
    return bytes([0, 0, code, a.ndim]) + struct.pack(">%dI" % a.ndim, *a.shape) + a.astype(a.dtype.newbyteorder(">")).tobytes()
put("idx", "u8.idx", idx(np.arange(12, dtype=np.uint8).reshape(3, 4), 0x08))
put("idx", "f4.idx", idx(np.arange(4, dtype=np.float32), 0x0D))
put("idx", "i2.idx.gz", gzip.compress(idx(np.arange(6, dtype=np.int16).reshape(2, 3), 0x0B)))

def safetensors(entries, meta=None):
    header, data, off = {}, b"", 0
    if meta:
        header["__metadata__"] = meta
    for name, (dt, a) in entries.items():
        raw = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
put("safetensors", "two.safetensors", safetensors({"w": ("F32", arrays["f4"]), "n": ("I64", np.arange(2))}, {"k": "v"}))
put("safetensors", "bf16.safetensors", safetensors({"h": ("BF16", np.arange(3, dtype=np.uint16))}))
put("safetensors", "empty.safetensors", safetensors({}))

put("text", "ws.txt", b"1 2 3\n4 5 6\n")
put("text", "csv.txt", b"# header\n1.5,2e-3,nan\n-inf,+4,5\n")
put("text", "col.txt", b"1\n2\n3\n")

try:
    import torch
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Linear(3, 2))
    b = io.BytesIO(); torch.save(m.state_dict(), b); put("pt", "state_dict.pt", b.getvalue())
    b = io.BytesIO(); torch.save(torch.nn.DataParallel(m).state_dict(), b); put("pt", "ddp.pt", b.getvalue())
    a = torch.arange(6.0)
    b = io.BytesIO(); torch.save({"model": {"a": a, "v": a[1:3]}, "epoch": 3, "lr": [0.1, None, True, "x"]}, b)
    put("pt", "nested.pt", b.getvalue())
    b = io.BytesIO(); torch.save({"h": torch.ones(2, dtype=torch.bfloat16), "b": torch.tensor([True])}, b)
    put("pt", "dtypes.pt", b.getvalue())
except ImportError:
    sys.exit("python3-torch is needed for the pt corpus")

# tar (WebDataset shards) and packed index seeds (the packed fuzzer provides the shard files).
def tar_bytes(members):
    import tarfile
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return b.getvalue()

png1 = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010800000000"
                     "3a7e9b550000000a49444154789c63600000000200015e2d2b8b0000000049454e44ae426082")
put("tar", "two.tar", tar_bytes([("a/000.png", png1), ("a/000.cls", b"1"), ("a/001.jpg", b"\xff\xd8\xff\xd9"),
                                 ("a/001.label.txt", b"0\n")]))
put("tar", "nolabel.tar", tar_bytes([("x.png", png1), ("readme.txt", b"hello")]))

def packed_index(records, classes=("a", "b"), shards=("shard-00000.bin",), align=4096, mode="copy"):
    header = json.dumps({"version": 1, "classes": list(classes), "samples": len(records), "shards": list(shards),
                         "align": align, "mode": mode}).encode()
    out = b"CRPKIDX1" + struct.pack("<Q", len(header)) + header
    for shard, size, offset, label in records:
        out += struct.pack("<IIQq", shard, size, offset, label)
    return out

put("packed", "two.crpk", packed_index([(0, 100, 0, 0), (0, 50, 4096, 1)]))
put("packed", "empty.crpk", packed_index([]))
put("packed", "two_shards.crpk", packed_index([(1, 0, 0, -1), (0, 8192, 0, 1)], shards=("shard-00000.bin", "shard-00001.bin"),
                                              align=64))
