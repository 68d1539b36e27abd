"""RandomPhotometricDistort for detection (issue 47) against torchvision.transforms.v2:

- adjust_hue (image_ops.h) equals TF2.adjust_hue on uint8, byte for byte: every 24-bit colour for
  a few factors (the edges ±0.5, a tiny negative factor that wraps a hue of 0 to 1.0, a random
  one) and random images of random sizes with random factors;
- the transform given the same params equals v2's RandomPhotometricDistort().transform(image,
  params): every branch (each jitter on or off, contrast before or after, every permutation or
  none), then params crucible draws itself; the boxes are untouched on both sides;
- the draws (op random_photometric_distort's detection_draw) follow v2's make_params: the six
  coins together (each jitter's, contrast_before, the permutation's) as one pattern, each
  factor's law (KS), the permutation's law over the 6 orders (chi-square), for the defaults and
  for other settings. Each comparison rejects at p < P_MIN and shows its power by rejecting a
  planted wrong sampler at the same threshold (test_distributions.py's method and helpers);
- data.detection_preset = "ssd" runs through the loader with sane boxes (its transforms are each
  held to torchvision alone, here and in test_detection_crop.py).

At most MAX_COMPARISONS comparisons with crucible's draws: a family false-alarm rate of at most
MAX_COMPARISONS × P_MIN per run.
"""
import os
import random
import subprocess
import tempfile
import unittest
from collections import Counter

import numpy as np
import torch

import crucible
from crucible import _native
from oracle import TF2, TV2, needs_v2
from test_distributions import LawTest

P_MIN = 1e-6
MAX_COMPARISONS = 12
_COMPARED = []

OP = "random_photometric_distort"
JITTERS = ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")
PERMUTATIONS = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]


def tearDownModule():
    assert len(_COMPARED) <= MAX_COMPARISONS, (
        f"{len(_COMPARED)} comparisons: raise MAX_COMPARISONS and the docstring's false-alarm rate with them")


def random_image(rng, channels=3, max_side=40):
    """A uint8 [C, H, W] image of a random size, some of it grey (r = g = b: hue's eqc branch) and
    some with two equal channels (its maxc == r == g ties)."""
    h, w = (int(v) for v in rng.integers(1, max_side, 2))
    img = rng.integers(0, 256, (channels, h, w), dtype=np.uint8)
    if channels == 3:
        img[:, : h // 3] = img[0:1, : h // 3]
        img[1, h // 3: 2 * h // 3] = img[0, h // 3: 2 * h // 3]
    return img


def ours(img, params, boxes=(), labels=()):
    return _native.detection_op(img, [list(b) for b in boxes], list(labels), OP, params)


def tv_params(p):
    """v2's make_params dict from crucible's drawn params (an empty list is v2's None)."""
    out = {k: (float(p[k][0]) if p[k] else None) for k in JITTERS}
    out["contrast_before"] = bool(p["contrast_before"][0])
    perm = p["channel_permutation"]
    out["channel_permutation"] = torch.tensor([int(v) for v in perm]) if perm else None
    return out


def theirs(img, params):
    from torchvision import tv_tensors
    return TV2.RandomPhotometricDistort().transform(tv_tensors.Image(torch.from_numpy(img)), params).numpy()


@needs_v2("adjust_hue against TF2.adjust_hue")
class AdjustHueTest(unittest.TestCase):
    def hue(self, img, factor):
        return _native.detection_op(img, [], [], "adjust_hue", {"hue_factor": [factor]})[0]

    def assert_equal(self, img, factor, what):
        mine, tv = self.hue(img, factor), TF2.adjust_hue(torch.from_numpy(img), factor).numpy()
        differ = mine != tv
        if differ.any():
            c, y, x = (int(v[0]) for v in np.nonzero(differ))
            self.fail(f"{what}, hue_factor {factor!r}: {int(differ.sum())} of {differ.size} levels differ from "
                      f"TF2.adjust_hue; first at pixel rgb {tuple(int(v) for v in img[:, y, x])}: crucible "
                      f"{tuple(int(v) for v in mine[:, y, x])}, torchvision {tuple(int(v) for v in tv[:, y, x])}")

    def test_every_colour(self):
        v = np.arange(256, dtype=np.uint8)
        cube = np.stack([a.reshape(4096, 4096) for a in np.meshgrid(v, v, v, indexing="ij")])
        for factor in (-0.5, 0.5, -2.0 ** -30, float(np.float32(random.Random(7).uniform(-0.5, 0.5)))):
            self.assert_equal(cube, factor, "every 24-bit colour")

    def test_random_images(self):
        rng = np.random.default_rng(11)
        for i in range(150):
            factor = float(rng.uniform(-0.5, 0.5)) if i % 4 else float(rng.choice([0.0, 1e-9, -1e-9, 0.25]))
            self.assert_equal(random_image(rng), factor, f"random image {i}")

    def test_one_channel_and_range(self):
        img = np.random.default_rng(1).integers(0, 256, (1, 5, 7), dtype=np.uint8)
        self.assertTrue((self.hue(img, 0.3) == TF2.adjust_hue(torch.from_numpy(img), 0.3).numpy()).all())
        for bad in (0.5001, -0.6):
            with self.assertRaisesRegex(ValueError, "hue_factor"):
                self.hue(img, bad)


@needs_v2("RandomPhotometricDistort's transform against v2's given the same params")
class PhotometricDistortEqualTest(unittest.TestCase):
    BOXES = [[1.5, 2.0, 10.25, 7.0], [0.0, 0.0, 3.0, 3.0]]

    def assert_same(self, img, params, what):
        out, boxes, labels, ids = ours(img, params, self.BOXES, [3, 5])
        tv = theirs(img, tv_params(params))
        differ = out != tv
        self.assertFalse(differ.any(), f"{what}: {int(differ.sum())} of {differ.size} levels differ from v2's "
                                       f"transform with params {tv_params(params)} (max {int(np.abs(out.astype(int) - tv).max())})")
        self.assertEqual([list(b) for b in boxes], self.BOXES, f"{what}: the boxes moved")
        self.assertEqual((list(labels), list(ids)), ([3, 5], [0, 1]), what)

    def test_every_branch(self):
        """Each jitter on or off × contrast before or after × no permutation or each of the 6."""
        rng = np.random.default_rng(5)
        img = random_image(rng, max_side=24)
        ranges = {"brightness_factor": (0.875, 1.125), "contrast_factor": (0.5, 1.5),
                  "saturation_factor": (0.5, 1.5), "hue_factor": (-0.05, 0.05)}
        for mask in range(16):
            for before in (0, 1):
                for perm in [None] + PERMUTATIONS:
                    p = {k: ([float(np.float32(rng.uniform(*ranges[k])))] if mask >> j & 1 else [])
                         for j, k in enumerate(JITTERS)}
                    p["contrast_before"] = [before]
                    p["channel_permutation"] = list(perm) if perm else []
                    self.assert_same(img, p, f"jitters {mask:04b}, contrast_before {before}, permutation {perm}")

    def test_drawn_params(self):
        """crucible's own draws (default and wide settings), applied by both; the key set is v2's."""
        from torchvision import tv_tensors
        rng = np.random.default_rng(9)
        keys = set(TV2.RandomPhotometricDistort().make_params([tv_tensors.Image(torch.zeros(3, 2, 2, dtype=torch.uint8))]))
        wide = {"brightness": [0.1, 3.0], "contrast": [0.0, 4.0], "saturation": [0.0, 5.0], "hue": [-0.5, 0.5], "p": [0.9]}
        for i in range(120):
            img = random_image(rng)
            settings = wide if i % 2 else {}
            p = _native.detection_draw(OP, 17, 0, i, img, [], [], settings)
            self.assertEqual(set(p), keys, "crucible's params are not v2's make_params keys")
            if settings:
                t = TV2.RandomPhotometricDistort(brightness=(0.1, 3.0), contrast=(0.0, 4.0), saturation=(0.0, 5.0),
                                                 hue=(-0.5, 0.5), p=0.9)
                self.assertTrue((ours(img, p)[0] ==
                                 t.transform(tv_tensors.Image(torch.from_numpy(img)), tv_params(p)).numpy()).all(),
                                f"sample {i} (wide settings): {tv_params(p)}")
            else:
                self.assert_same(img, p, f"sample {i}")

    def test_one_channel(self):
        img = np.random.default_rng(2).integers(0, 256, (1, 9, 6), dtype=np.uint8)
        for i in range(20):
            p = _native.detection_draw(OP, 3, 1, i, img, [], [], {"p": [0.9]})
            self.assertIn(p["channel_permutation"], ([], [0]))
            self.assert_same(img, p, f"one channel, sample {i}")

    def test_law_one_and_settings(self):
        img = np.zeros((3, 4, 4), np.uint8)
        a = _native.detection_draw(OP, 5, 2, 7, img, [], [], {})
        self.assertEqual(a, _native.detection_draw(OP, 5, 2, 7, img, [], [], {}), "the same sample drew differently")
        draws = [_native.detection_draw(OP, 5, e, 7, img, [], [], {}) for e in range(8)]
        self.assertGreater(len({repr(d) for d in draws}), 1, "the epoch does not change the draws")
        for bad, key in (({"hue": [-0.6, 0.0]}, "hue"), ({"brightness": [-0.1, 1.0]}, "brightness"),
                         ({"contrast": [1.5, 0.5]}, "contrast"), ({"p": [1.5]}, "p"), ({"saturation": [1.0]}, "saturation")):
            with self.assertRaisesRegex(ValueError, key):
                _native.detection_draw(OP, 5, 0, 0, img, [], [], bad)


# ---- the draws' laws --------------------------------------------------------------------------------

def seeded_draws(t, n, seed):
    """n of torchvision's make_params for a 3-channel image, with torch's generator seeded."""
    from torchvision import tv_tensors
    img = tv_tensors.Image(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [t.make_params([img]) for _ in range(n)]


def crucible_draws(n, seed, settings):
    img = np.zeros((3, 4, 4), np.uint8)
    return [tv_params(_native.detection_draw(OP, seed, 0, i, img, [], [], settings)) for i in range(n)]


def pattern(p):
    """The six coins of one draw as one category."""
    return tuple(p[k] is not None for k in JITTERS) + (p["contrast_before"], p["channel_permutation"] is not None)


def naive_shuffle(rng):
    """The classic wrong shuffle (swap each place with any place): 27 paths onto 6 orders, unevenly."""
    order = [0, 1, 2]
    for i in range(3):
        j = rng.randrange(3)
        order[i], order[j] = order[j], order[i]
    return tuple(order)


@needs_v2("RandomPhotometricDistort's draws against v2's make_params")
class PhotometricDistortLawTest(LawTest):
    N = 20000
    compared = _COMPARED  # this module's family of comparisons

    def run_laws(self, name, kwargs, settings, seed):
        mine = crucible_draws(self.N, seed, settings)
        tv = seeded_draws(TV2.RandomPhotometricDistort(**kwargs), self.N, seed)
        p = kwargs.get("p", 0.5)
        # The coins: one category per pattern of six (2^6 cells), so independence is compared too.
        self.same_law(f"{name}: the six coins", [pattern(d) for d in mine], [pattern(d) for d in tv], "chi2")
        r = random.Random(seed)
        planted = [pattern(d)[:3] + (r.random() < p + 0.05,) + pattern(d)[4:] for d in mine]
        self.rejects(f"{name}: the hue coin with p + 0.05", planted, [pattern(d) for d in tv], "chi2")
        return mine, tv

    def factor_law(self, name, key, lo, hi, mine, tv):
        a = [d[key] for d in mine if d[key] is not None]
        b = [d[key] for d in tv if d[key] is not None]
        self.same_law(f"{name}: {key}", a, b, "ks")
        r = random.Random(len(a))
        top = hi - 0.1 * (hi - lo)
        self.rejects(f"{name}: {key} uniform on [{lo}, {top:g}]", [r.uniform(lo, top) for _ in a], b, "ks")

    def test_defaults_D14(self):
        mine, tv = self.run_laws("defaults", {}, {}, seed=101)
        for key, (lo, hi) in zip(JITTERS, [(0.875, 1.125), (0.5, 1.5), (0.5, 1.5), (-0.05, 0.05)]):
            self.factor_law("defaults", key, lo, hi, mine, tv)
        a = [tuple(int(v) for v in d["channel_permutation"]) for d in mine if d["channel_permutation"] is not None]
        b = [tuple(int(v) for v in d["channel_permutation"]) for d in tv if d["channel_permutation"] is not None]
        self.assertEqual(set(a), set(PERMUTATIONS))
        self.same_law("defaults: channel_permutation", a, b, "chi2")
        r = random.Random(3)
        self.rejects("defaults: channel_permutation by the naive shuffle", [naive_shuffle(r) for _ in a], b, "chi2")

    def test_other_settings(self):
        kwargs = dict(brightness=(0.2, 2.0), contrast=(0.0, 3.0), saturation=(1.0, 1.0), hue=(-0.5, 0.5), p=0.8)
        settings = {k: [float(v) for v in kwargs[k]] for k in ("brightness", "contrast", "saturation", "hue")}
        settings["p"] = [0.8]
        mine, tv = self.run_laws("p=0.8, wide ranges", kwargs, settings, seed=202)
        self.factor_law("p=0.8, wide ranges", "hue_factor", -0.5, 0.5, mine, tv)


# ---- the "ssd" preset -----------------------------------------------------------------------------------

MAKE_SET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make-detection-set")


def loader_samples(path, preset, seed=3):
    """{image_id: (image [C, H, W], boxes, labels)} of one training epoch through crucible's loader."""
    out = {}
    settings = {"data.detection_preset": preset, "data.hflip": 0.5}
    with crucible.ImageLoader(path, batch_size=4, train=True, seed=seed, threads=2, settings=settings) as loader:
        for images, targets in loader:
            for image, t in zip(images, targets):
                out[int(t["image_id"])] = (image.numpy().copy(), t["boxes"].tolist(), t["labels"].tolist())
    return out


class SsdPresetTest(unittest.TestCase):
    """data.detection_preset = "ssd" (references' ssd: RandomPhotometricDistort, RandomZoomOut(fill=mean),
    RandomIoUCrop, RandomHorizontalFlip, SanitizeBoundingBoxes) runs in the loader: every image comes out, its
    boxes inside it with sides of at least 1 and labels from its own, some zoomed out (larger than the
    image), some distorted; the same seed gives the same bytes. Each transform is held to torchvision
    alone (this file, test_detection_crop.py, test_detection_data.py); the chain's order is the entry's."""

    def test_runs_and_keeps_boxes_sane(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([MAKE_SET, d, "--train", "24", "--val", "2", "--seed", "8"], check=True)
            path = os.path.join(d, "annotations", "instances_train.json")
            plain = loader_samples(path, "hflip")
            ssd = loader_samples(path, "ssd")
            self.assertEqual(set(ssd), set(plain))
            larger = changed = 0
            for image_id, (image, boxes, labels) in ssd.items():
                original, _, olabels = plain[image_id]
                _, h, w = image.shape
                larger += h > original.shape[1] or w > original.shape[2]
                changed += image.shape != original.shape or not np.array_equal(image, original)
                for x1, y1, x2, y2 in boxes:
                    self.assertTrue(0 <= x1 and x2 - x1 >= 1 and x2 <= w and 0 <= y1 and y2 - y1 >= 1 and y2 <= h,
                                    f"image {image_id} ({w}x{h}): box {[x1, y1, x2, y2]}")
                self.assertFalse(Counter(labels) - Counter(olabels), f"image {image_id}: labels {labels} not its own")
            self.assertGreater(larger, 3, "no image was zoomed out")
            self.assertGreater(changed, 12)
            again = loader_samples(path, "ssd")
            for image_id, (image, boxes, labels) in ssd.items():
                self.assertTrue(np.array_equal(again[image_id][0], image) and again[image_id][1:] == (boxes, labels),
                                f"image {image_id}: the same seed gave another sample")


if __name__ == "__main__":
    unittest.main()
