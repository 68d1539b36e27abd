"""SSD's geometric augmentations (issue 47) against torchvision 0.29's transforms.v2:
RandomIoUCrop and RandomZoomOut on a tv_tensors.Image (uint8) with tv_tensors.BoundingBoxes
(XYXY, float32).

- Given the same draws: crucible's draw for a sample (_native.detection_draw) is fed to v2's own
  transform(inpt, params); pixels are equal, boxes equal as float32, and the boxes crucible keeps
  with their labels are those v2 does not zero (RandomIoUCrop marks the boxes whose centre is
  outside the crop as [0, 0, 0, 0] for SanitizeBoundingBoxes to drop), also after
  SanitizeBoundingBoxes on both sides. Images of many sizes, boxes touching the edges, tiny,
  on the pixel grid (centres on the crop's edge), partly outside, and none.
- The decisions: each crop crucible draws is replayed into v2's make_params (torch.randint and
  torch.rand answered with the option crucible chose and uniforms that give crucible's sizes and
  position): v2 must keep that crop at its first trial, with crucible's is_within_crop_area; a
  second draw means v2 rejects what crucible kept. RandomZoomOut's padding likewise.
- The laws (as tests/python/test_distributions.py, whose helpers this file imports): many draws
  of crucible and of v2's make_params (forward, for RandomZoomOut's p) under torch.manual_seed,
  compared as two samples — the option the search ends on and the number of option draws
  (chi-square), the crop's width, height, aspect, left and top (KS), the boxes kept, on images
  where the search often fails and without boxes; RandomZoomOut's decision, canvas and placement.
  Each comparison rejects at p < P_MIN = 1e-6 and prints its p-value (16 comparisons: a family
  false-alarm rate of at most 1.6e-5 a run, MAX_COMPARISONS checked at the end); each is also
  shown to reject a planted wrong sampler (a failed round that gives up instead of drawing another
  option, a scale range 0.45–1, an aspect limit 1.6, a crop one pixel off, a zoom p of 0.35, …).
- The "ssdlite" preset through the Python loader (no oracle: crucible's own operations): each
  training image is a crop of its image, mirrored with data.hflip = 1, with the boxes and labels
  the crop, the flip and SanitizeBoundingBoxes leave. Settings the search cannot run with are
  refused naming them.
"""
import contextlib
import os
import random
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch

import crucible
from crucible import _native
from oracle import TV2, needs_v2
from test_distributions import P_MIN, LawTest, Spy, seeded

if TV2 is not None:
    from torchvision import tv_tensors

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_SET = os.path.join(HERE, "..", "..", "scripts", "make-detection-set")
SEED = 20240607
MAX_COMPARISONS = 16
_COMPARED = []
SANITIZE = {"min_size": [1.0], "min_area": [1.0]}


def tearDownModule():
    if _COMPARED:
        print(f"\n{len(_COMPARED)} comparisons with torchvision, each rejecting at p < {P_MIN:g}: family "
              f"false-alarm rate <= {len(_COMPARED) * P_MIN:.1e} per run")
    assert len(_COMPARED) <= MAX_COMPARISONS, f"{len(_COMPARED)} comparisons: raise MAX_COMPARISONS"


# ---- samples -----------------------------------------------------------------------------------------

def f32(x):
    return float(np.float32(x))


def random_box(rng, kind, w, h):
    if kind == "whole":
        return [0.0, 0.0, float(w), float(h)]
    if kind == "grid":  # integer corners: centres on whole and half pixels, on a crop's edge
        x1, y1 = rng.randint(0, w - 1), rng.randint(0, h - 1)
        return [float(x1), float(y1), float(rng.randint(x1 + 1, w)), float(rng.randint(y1 + 1, h))]
    if kind == "edge":  # touching one or more sides of the image
        x1, y1 = rng.choice([0.0, f32(rng.uniform(0, w - 2))]), rng.choice([0.0, f32(rng.uniform(0, h - 2))])
        return [x1, y1, rng.choice([float(w), f32(rng.uniform(x1 + 1, w))]),
                rng.choice([float(h), f32(rng.uniform(y1 + 1, h))])]
    if kind == "tiny":
        bw, bh = rng.uniform(0.05, 2.0), rng.uniform(0.05, 2.0)
        x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        return [f32(x1), f32(y1), f32(x1 + bw), f32(y1 + bh)]
    if kind == "outside":  # reaching past the image (v2 clamps it like any other)
        return [f32(rng.uniform(-5, w / 2)), f32(rng.uniform(-5, h / 2)), f32(rng.uniform(w / 2 + 1, w + 5)),
                f32(rng.uniform(h / 2 + 1, h + 5))]
    x1, y1 = rng.uniform(0, w - 1), rng.uniform(0, h - 1)
    return [f32(x1), f32(y1), f32(rng.uniform(x1 + 0.5, w)), f32(rng.uniform(y1 + 0.5, h))]


def random_sample(rng):
    """(image uint8 [C, H, W], boxes, labels) of varied size, channels and boxes."""
    w, h, c = rng.randint(6, 90), rng.randint(6, 90), rng.choice([3, 3, 3, 1])
    image = np.random.default_rng(rng.randrange(2 ** 32)).integers(0, 256, (c, h, w), dtype=np.uint8)
    kind = rng.choice(["none", "random", "edge", "tiny", "grid", "mixed", "mixed"])
    n = 0 if kind == "none" else rng.randint(1, 8)
    kinds = ["random", "edge", "tiny", "grid", "whole", "outside"]
    boxes = [random_box(rng, rng.choice(kinds) if kind == "mixed" else kind, w, h) for _ in range(n)]
    return image, boxes, [rng.randint(0, 90) for _ in boxes]


def v2_sample(image, boxes):
    h, w = image.shape[-2:]
    return (tv_tensors.Image(torch.from_numpy(image.copy())),
            tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY",
                                     canvas_size=(h, w)))


def boxes_tensor(boxes):
    return torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)


def iou_params_v2(p):
    """crucible's random_iou_crop draw as v2's make_params returns it ({}: leave as is)."""
    if "top" not in p:
        return {}
    return dict(top=int(p["top"][0]), left=int(p["left"][0]), height=int(p["height"][0]), width=int(p["width"][0]),
                is_within_crop_area=torch.tensor([v != 0 for v in p["is_within_crop_area"]], dtype=torch.bool))


# ---- replaying crucible's draws into v2's make_params -------------------------------------------------

def smallest_uniform(f, target):
    """The smallest u = k / 2^24 (torch.rand's float32 grid) with f(u) >= target, f non-decreasing."""
    lo, hi = 0, (1 << 24) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if f(mid / 2 ** 24) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo / 2 ** 24


def uniform_giving(f, target, what):
    u = smallest_uniform(f, target)
    assert f(u) == target, f"no torch.rand value gives crucible's {what} {target} (nearest {f(u)})"
    return u


def scaled(lo, span, size):
    """size × (lo + span × u) truncated, in torch's float32 arithmetic (v2's make_params' expression)."""
    return lambda u: int(size * (lo + span * torch.tensor([u], dtype=torch.float32))[0])


class Replay:
    """torch.randint and torch.rand answering from queues (as v2's make_params calls them); a call
    past the queue means v2 went on drawing where crucible stopped."""

    def __init__(self, ints, floats):
        self.ints, self.floats = list(ints), list(floats)

    def randint(self, *args, **kwargs):
        assert self.ints, "v2 draws another sampler option: it found no crop in the round crucible's crop ends"
        return torch.tensor([self.ints.pop(0)])

    def rand(self, n, *args, **kwargs):
        assert self.floats, "v2 draws again: it rejects the crop crucible kept"
        values = self.floats.pop(0)
        assert len(values) == n
        return torch.tensor(values, dtype=torch.float32)

    def __enter__(self):
        self.patches = [mock.patch.object(torch, "randint", self.randint), mock.patch.object(torch, "rand", self.rand)]
        for p in self.patches:
            p.__enter__()
        return self

    def __exit__(self, *exc):
        for p in reversed(self.patches):
            p.__exit__(*exc)


def replay_iou_crop(t, image, bb, p):
    """v2's make_params answered with crucible's option and the uniforms of crucible's crop."""
    h, w = image.shape[-2:]
    floats = []
    if "top" in p:
        cw, ch, left, top = (int(p[k][0]) for k in ("width", "height", "left", "top"))
        span = t.max_scale - t.min_scale
        floats.append([uniform_giving(scaled(t.min_scale, span, w), cw, "crop width"),
                       uniform_giving(scaled(t.min_scale, span, h), ch, "crop height")])
        floats.append([uniform_giving(scaled(0.0, 1.0, w - cw), left, "left"),
                       uniform_giving(scaled(0.0, 1.0, h - ch), top, "top")])
    with Replay([int(p["option"][0])], floats) as r:
        params = t.make_params([image, bb])
    assert not r.floats, "v2 stopped before crucible's crop"
    return params


def replay_zoom_out(t, image, p):
    h, w = image.shape[-2:]
    left, top, right, bottom = (int(v) for v in p["padding"])
    cw, ch = w + left + right, h + top + bottom
    lo, span = t.side_range[0], t.side_range[1] - t.side_range[0]
    fw, fh = scaled(lo, span, w), scaled(lo, span, h)
    u = max(smallest_uniform(fw, cw), smallest_uniform(fh, ch))
    assert (fw(u), fh(u)) == (cw, ch), f"no torch.rand value gives crucible's canvas {cw}x{ch}"
    position = [uniform_giving(scaled(0.0, 1.0, cw - w), left, "left"),
                uniform_giving(scaled(0.0, 1.0, ch - h), top, "top")]
    with Replay([], [[u], position]):
        return t.make_params([image])


# ---- given the same draws ------------------------------------------------------------------------------

@needs_v2("RandomIoUCrop's and RandomZoomOut's transforms against v2's")
class IoUCropTransformTest(unittest.TestCase):
    CASES, DRAWS = 300, 4

    def each_draw(self):
        rng = random.Random(SEED)
        for case in range(self.CASES):
            image, boxes, labels = random_sample(rng)
            for index in range(self.DRAWS):
                p = _native.detection_draw("random_iou_crop", SEED, case, index, image, boxes, labels, {})
                yield f"case {case} draw {index} ({image.shape}, {len(boxes)} boxes, params {p})", image, boxes, \
                    labels, p

    def test_same_pixels_boxes_and_labels_as_v2(self):
        t, crops = TV2.RandomIoUCrop(), 0
        for what, image, boxes, labels, p in self.each_draw():
            img_c, boxes_c, labels_c, ids_c = _native.detection_op(image, boxes, labels, "random_iou_crop", p)
            image_v, bb_v = v2_sample(image, boxes)
            vp = iou_params_v2(p)
            img_v, out_v = t.transform(image_v, vp), t.transform(bb_v, vp)
            np.testing.assert_array_equal(img_c, img_v.numpy(), err_msg=what)
            within = vp["is_within_crop_area"] if vp else torch.ones(len(boxes), dtype=torch.bool)
            crops += bool(vp)
            kept_v = out_v[within].as_subclass(torch.Tensor)
            self.assertTrue(torch.equal(boxes_tensor(boxes_c), kept_v), f"{what}: boxes {boxes_c}, v2 {kept_v.tolist()}")
            self.assertTrue(bool((out_v[~within] == 0).all()), f"{what}: v2 keeps a box crucible drops")
            self.assertEqual(labels_c, [labels[i] for i in range(len(labels)) if within[i]], what)
            self.assertEqual(ids_c, [i for i in range(len(labels)) if within[i]], what)
            # Without is_within_crop_area crucible computes it from the crop: the same boxes.
            if vp:
                alone = {k: v for k, v in p.items() if k != "is_within_crop_area"}
                self.assertEqual(_native.detection_op(image, boxes, labels, "random_iou_crop", alone)[1], boxes_c, what)
        self.assertGreater(crops, self.CASES)  # most draws crop

    def test_then_sanitized_as_v2(self):
        """RandomIoUCrop then SanitizeBoundingBoxes, as the presets end: the boxes and labels that survive."""
        t = TV2.RandomIoUCrop()
        for what, image, boxes, labels, p in self.each_draw():
            img_c, boxes_c, labels_c, _ = _native.detection_op(image, boxes, labels, "random_iou_crop", p)
            _, boxes_c, labels_c, _ = _native.detection_op(img_c, boxes_c, labels_c, "sanitize_bounding_boxes", SANITIZE)
            image_v, bb_v = v2_sample(image, boxes)
            vp = iou_params_v2(p)
            out = TV2.SanitizeBoundingBoxes()({"image": t.transform(image_v, vp), "boxes": t.transform(bb_v, vp),
                                               "labels": torch.tensor(labels, dtype=torch.int64)})
            self.assertTrue(torch.equal(boxes_tensor(boxes_c), out["boxes"].as_subclass(torch.Tensor)),
                            f"{what}: boxes {boxes_c}, v2 {out['boxes'].tolist()}")
            self.assertEqual(labels_c, out["labels"].tolist(), what)

    def test_v2_keeps_each_crop_crucible_draws(self):
        """Replayed into v2's make_params, crucible's option and crop are kept at once, with the same
        boxes inside (is_within_crop_area); the leave-as-is option returns v2's {}."""
        t = TV2.RandomIoUCrop()
        for what, image, boxes, labels, p in self.each_draw():
            image_v, bb_v = v2_sample(image, boxes)
            try:
                got = replay_iou_crop(t, image_v, bb_v, p)
            except AssertionError as e:
                self.fail(f"{what}: {e}")
            want = iou_params_v2(p)
            self.assertEqual(sorted(got), sorted(want), what)
            for k in ("top", "left", "height", "width"):
                if k in want:
                    self.assertEqual(got[k], want[k], what)
            if want:
                self.assertEqual(got["is_within_crop_area"].tolist(), want["is_within_crop_area"].tolist(),
                                 f"{what}: v2's is_within_crop_area (first), crucible's (second)")


@needs_v2("RandomZoomOut's pad against v2's")
class ZoomOutTransformTest(unittest.TestCase):
    FILLS = ([123.0, 117.0, 104.0], [123.7, 117.2, 104.99], [0.0], [255.0], [37.9], [1.5, 254.9999999, 7.0])

    def test_same_pixels_and_boxes_as_v2(self):
        rng, zooms = random.Random(SEED + 1), 0
        for case in range(200):
            image, boxes, labels = random_sample(rng)
            fill = rng.choice([f for f in self.FILLS if len(f) in (1, image.shape[0])])
            settings = {"fill": fill, "p": [rng.choice([0.5, 1.0])], "side_range": rng.choice([[1.0, 4.0], [1.0, 1.5]])}
            t = TV2.RandomZoomOut(fill=fill if len(fill) > 1 else fill[0], side_range=settings["side_range"],
                                  p=settings["p"][0])
            for index in range(3):
                p = _native.detection_draw("random_zoom_out", SEED, case, index, image, boxes, labels, settings)
                what = f"case {case} draw {index} ({image.shape}, fill {fill}, params {p})"
                img_c, boxes_c, labels_c, _ = _native.detection_op(image, boxes, labels, "random_zoom_out", p)
                image_v, bb_v = v2_sample(image, boxes)
                vp = {"padding": [int(v) for v in p["padding"]]} if p else None
                img_v = t.transform(image_v, vp) if vp else image_v
                out_v = t.transform(bb_v, vp) if vp else bb_v
                zooms += vp is not None
                np.testing.assert_array_equal(img_c, img_v.numpy(), err_msg=what)
                self.assertTrue(torch.equal(boxes_tensor(boxes_c), out_v.as_subclass(torch.Tensor)),
                                f"{what}: boxes {boxes_c}, v2 {out_v.tolist()}")
                self.assertEqual(labels_c, labels, what)
                if vp:
                    self.assertEqual(replay_zoom_out(t, image_v, p), vp, what)
                    self.assertEqual(tuple(out_v.canvas_size), img_c.shape[1:], what)
        self.assertGreater(zooms, 200)


class SettingsTest(unittest.TestCase):
    """Settings the search cannot run with are refused naming the setting and its value."""

    def test_refused(self):
        image = np.zeros((3, 20, 30), dtype=np.uint8)
        for op, settings, named in [
                ("random_iou_crop", {"sampler_options": [0.0, 0.5]}, "sampler_options = [0, 0.5]"),
                ("random_iou_crop", {"min_scale": [0.0]}, "min_scale = 0"),
                ("random_iou_crop", {"max_scale": [1.5]}, "max_scale = 1.5"),
                ("random_iou_crop", {"min_aspect_ratio": [3.0]}, "min_aspect_ratio = 3"),
                ("random_iou_crop", {"trials": [0.0]}, "trials = 0"),
                ("random_zoom_out", {"fill": [300.0], "p": [1.0]}, "fill = [300]"),
                ("random_zoom_out", {"fill": [0.0], "side_range": [0.5, 2.0]}, "side_range = [0.5, 2]"),
                ("random_zoom_out", {"fill": [0.0], "p": [1.5]}, "p = 1.5")]:
            with self.assertRaisesRegex(ValueError, named.replace("[", r"\[").replace(".", r"\.")):
                _native.detection_draw(op, 1, 0, 0, image, [[1, 1, 5, 5]], [0], settings)

    def test_fill_channels(self):
        image = np.zeros((3, 4, 5), dtype=np.uint8)
        with self.assertRaisesRegex(ValueError, "fill"):
            _native.detection_op(image, [], [], "random_zoom_out", {"padding": [1, 1, 1, 1], "fill": [1.0, 2.0]})


# ---- the laws ------------------------------------------------------------------------------------------

class LawCase(LawTest):
    compared = _COMPARED  # this module's family of comparisons


def summary(option, rounds, crop, within):
    """One search's outcome: the option it ends on, its option draws, the crop (or None), boxes kept."""
    return {"option": option, "rounds": rounds, "crop": crop, "kept": sum(bool(v) for v in within)}


@contextlib.contextmanager
def torch_seeded(seed):
    """torch's global generator seeded for v2's draws, restored afterwards (test_distributions.seeded)."""
    ctx = seeded(seed)
    try:
        yield
    finally:
        ctx.__exit__(None, None, None)


def crucible_iou_draws(image, boxes, n, settings=None):
    out = []
    for i in range(n):
        p = _native.detection_draw("random_iou_crop", SEED, 3, i, image, boxes, [0] * len(boxes), settings or {})
        crop = tuple(int(p[k][0]) for k in ("top", "left", "height", "width")) if "top" in p else None
        out.append(summary(int(p["option"][0]), int(p["rounds"][0]), crop, p.get("is_within_crop_area", [])))
    return out


def torchvision_iou_draws(image, boxes, n, seed, t=None, give_up=False):
    """v2's make_params n times; its option draws recorded by a spy on torch.randint. give_up
    plants a wrong search: a round without a crop leaves the sample as is (the option 1.0)."""
    t = t or TV2.RandomIoUCrop()
    image_v, bb_v = v2_sample(image, boxes)
    calls, out = [], []
    real = torch.randint

    def randint(*args, **kwargs):
        v = real(*args, **kwargs)
        if give_up and calls:
            v = torch.tensor([t.options.index(1.0)])
        calls.append(int(v))
        return v

    with torch_seeded(seed), mock.patch.object(torch, "randint", randint):
        for _ in range(n):
            calls.clear()
            p = t.make_params([image_v, bb_v])
            crop = (p["top"], p["left"], p["height"], p["width"]) if p else None
            out.append(summary(calls[-1], len(calls), crop, p["is_within_crop_area"].tolist() if p else []))
    return out


def crops(draws, f):
    return [f(*d["crop"]) for d in draws if d["crop"] is not None]


# (top, left, height, width) → a value of the crop
CROP_VALUES = {"width": lambda t, l, h, w: w, "height": lambda t, l, h, w: h, "aspect": lambda t, l, h, w: w / h,
               "left": lambda t, l, h, w: l, "top": lambda t, l, h, w: t}


@needs_v2("RandomIoUCrop's draws against v2's make_params")
class IoUCropLawTest(LawCase):
    def test_search_D14(self):
        """Boxes of several sizes: which option the search ends on, after how many option draws, and the crop."""
        image = np.zeros((3, 48, 64), dtype=np.uint8)
        boxes = [[4, 4, 44, 36], [30, 20, 60, 46], [8, 30, 16, 40], [60, 0, 64, 5]]
        ours, theirs = crucible_iou_draws(image, boxes, 40000), torchvision_iou_draws(image, boxes, 10000, 1)
        for key in ("option", "rounds", "kept"):
            self.same_law(f"iou crop: {key}", [d[key] for d in ours], [d[key] for d in theirs], "chi2")
        for key, f in CROP_VALUES.items():
            self.same_law(f"iou crop: crop {key}", crops(ours, f), crops(theirs, f), "ks")

        given_up = torchvision_iou_draws(image, boxes, 4000, 2, give_up=True)
        for key in ("option", "rounds"):
            self.rejects(f"iou crop: {key}, a failed round gives up", [d[key] for d in given_up],
                         [d[key] for d in theirs], "chi2")
        # Wrong settings of crucible's own search as planted samplers (its draws are cheap).
        any_iou = crucible_iou_draws(image, boxes, 40000, {"sampler_options": [0.0, 1.0]})
        self.rejects("iou crop: kept, any IoU", [d["kept"] for d in any_iou], [d["kept"] for d in theirs], "chi2")
        scale = crucible_iou_draws(image, boxes, 40000, {"min_scale": [0.45]})
        for key in ("width", "height"):
            self.rejects(f"iou crop: crop {key}, scale 0.45-1", crops(scale, CROP_VALUES[key]),
                         crops(theirs, CROP_VALUES[key]), "ks")
        aspect = crucible_iou_draws(image, boxes, 40000, {"max_aspect_ratio": [1.6]})
        self.rejects("iou crop: crop aspect, at most 1.6", crops(aspect, CROP_VALUES["aspect"]),
                     crops(theirs, CROP_VALUES["aspect"]), "ks")
        # crucible's crop one pixel to the right / lower where it has room: an off-by-one in the placement.
        self.rejects("iou crop: crop left, one pixel off", crops(ours, lambda t, l, h, w: l + (l + w < 64)),
                     crops(theirs, CROP_VALUES["left"]), "ks")
        self.rejects("iou crop: crop top, one pixel off", crops(ours, lambda t, l, h, w: t + (t + h < 48)),
                     crops(theirs, CROP_VALUES["top"]), "ks")

    def test_search_that_mostly_fails_D14(self):
        """One tiny box: no crop reaches IoU 0.1, so only the options 0.0 (a crop holding its centre)
        and 1.0 end the search; the number of option draws shows the loop."""
        image = np.zeros((3, 48, 64), dtype=np.uint8)
        boxes = [[30, 20, 32.5, 22]]
        ours, theirs = crucible_iou_draws(image, boxes, 20000), torchvision_iou_draws(image, boxes, 2500, 6)
        for key in ("option", "rounds"):
            self.same_law(f"iou crop, tiny box: {key}", [d[key] for d in ours], [d[key] for d in theirs], "chi2")
        given_up = torchvision_iou_draws(image, boxes, 2500, 7, give_up=True)
        self.rejects("iou crop, tiny box: rounds, a failed round gives up", [d["rounds"] for d in given_up],
                     [d["rounds"] for d in theirs], "chi2")

    def test_no_boxes_D14(self):
        """No box: every round fails until the option 1.0 is drawn (crucible skips the trials)."""
        image = np.zeros((3, 20, 24), dtype=np.uint8)
        ours, theirs = crucible_iou_draws(image, [], 20000), torchvision_iou_draws(image, [], 1500, 8)
        self.assertTrue(all(d["crop"] is None for d in ours + theirs))
        self.same_law("iou crop, no box: rounds", [d["rounds"] for d in ours], [d["rounds"] for d in theirs], "chi2")
        # The shortcut done wrong: no box, so leave it as it is without drawing options.
        self.rejects("iou crop, no box: rounds, one option draw", [1] * len(ours), [d["rounds"] for d in theirs],
                     "chi2")


def crucible_zoom_draws(image, n, settings):
    out = []
    for i in range(n):
        p = _native.detection_draw("random_zoom_out", SEED, 5, i, image, [], [], settings)
        out.append(tuple(int(v) for v in p["padding"]) if p else None)
    return out


def torchvision_zoom_draws(image, n, seed, t):
    """v2's forward n times (its p draw, then make_params), the padding recorded by a spy."""
    got = []
    image_v = tv_tensors.Image(torch.from_numpy(image))
    with torch_seeded(seed), Spy(t, "make_params", lambda a, k, out: got.append(tuple(out["padding"]))):
        out = []
        for _ in range(n):
            got.clear()
            t(image_v)
            out.append(got[0] if got else None)
    return out


ZOOM_VALUES = {"canvas width": lambda l, t, r, b: 10 + l + r, "canvas height": lambda l, t, r, b: 8 + t + b,
               "left": lambda l, t, r, b: l, "top": lambda l, t, r, b: t}


@needs_v2("RandomZoomOut's draws against v2's")
class ZoomOutLawTest(LawCase):
    def test_draws_D14(self):
        image = np.zeros((3, 8, 10), dtype=np.uint8)
        settings = {"fill": [123.0, 117.0, 104.0], "side_range": [1.0, 4.0], "p": [0.3]}
        ours = crucible_zoom_draws(image, 40000, settings)
        theirs = torchvision_zoom_draws(image, 20000, 11, TV2.RandomZoomOut(fill=(123, 117, 104), p=0.3))
        self.same_law("zoom out: zooms", [d is not None for d in ours], [d is not None for d in theirs], "chi2")
        for key, f in ZOOM_VALUES.items():
            self.same_law(f"zoom out: {key}", [f(*d) for d in ours if d], [f(*d) for d in theirs if d], "ks")

        # Wrong settings of crucible's own draw as planted samplers.
        wrong_p = crucible_zoom_draws(image, 40000, dict(settings, p=[0.35]))
        self.rejects("zoom out: zooms, p 0.35", [d is not None for d in wrong_p], [d is not None for d in theirs], "chi2")
        short = crucible_zoom_draws(image, 40000, dict(settings, side_range=[1.0, 3.7]))
        for key in ("canvas width", "canvas height"):
            f = ZOOM_VALUES[key]
            self.rejects(f"zoom out: {key}, side range 1-3.7", [f(*d) for d in short if d],
                         [f(*d) for d in theirs if d], "ks")
        # crucible's image one pixel to the right / lower where the canvas has room.
        zoomed = [d for d in ours if d]
        self.rejects("zoom out: left, one pixel off", [l + (r > 0) for l, t, r, b in zoomed],
                     [d[0] for d in theirs if d], "ks")
        self.rejects("zoom out: top, one pixel off", [t + (b > 0) for l, t, r, b in zoomed],
                     [d[1] for d in theirs if d], "ks")


# ---- the preset ----------------------------------------------------------------------------------------

def loader_samples(path, preset, hflip):
    """{image_id: (image [C, H, W], boxes, labels)} of one training epoch through crucible's loader."""
    out = {}
    settings = {"data.detection_preset": preset, "data.hflip": hflip}
    with crucible.ImageLoader(path, batch_size=4, train=True, seed=3, threads=2, settings=settings) as loader:
        for images, targets in loader:
            for image, t in zip(images, targets):
                out[int(t["image_id"])] = (image.numpy().copy(), t["boxes"].tolist(), t["labels"].tolist())
    return out


def crop_positions(image, crop):
    """Every (top, left) where `crop` is a part of `image`."""
    _, h, w = crop.shape
    H, W = image.shape[1:]
    if h > H or w > W:
        return []
    match = np.ones((H - h + 1, W - w + 1), dtype=bool)
    for dy, dx in ((0, 0), (h - 1, w - 1), (h // 2, w // 2)):  # a few pixels first, then the whole crop
        match &= (image[:, dy:dy + H - h + 1, dx:dx + W - w + 1] == crop[:, dy:dy + 1, dx:dx + 1]).all(0)
    return [(int(t), int(l)) for t, l in zip(*np.nonzero(match)) if np.array_equal(image[:, t:t + h, l:l + w], crop)]


class SsdlitePresetTest(unittest.TestCase):
    """data.detection_preset = "ssdlite" (references' ssdlite: RandomIoUCrop, RandomHorizontalFlip(data.hflip),
    SanitizeBoundingBoxes): each training image is a crop of its image (mirrored with data.hflip = 1), and
    its boxes and labels are random_iou_crop's at that crop, then the flip's, then sanitize's."""

    def test_crop_flip_sanitize(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([MAKE_SET, d, "--train", "24", "--val", "2", "--seed", "5"], check=True)
            path = os.path.join(d, "annotations", "instances_train.json")
            plain = loader_samples(path, "hflip", 0.0)
            cropped = 0
            for hflip in (0.0, 1.0):
                for image_id, (image, boxes, labels) in loader_samples(path, "ssdlite", hflip).items():
                    original, obox, olabels = plain[image_id]
                    seen = image[..., ::-1].copy() if hflip else image
                    _, h, w = image.shape
                    cropped += (h, w) != original.shape[1:]
                    want = []
                    for top, left in crop_positions(original, seen):
                        crop = {"top": [top], "left": [left], "height": [h], "width": [w]}
                        out = _native.detection_op(original, obox, olabels, "random_iou_crop", crop)
                        out = _native.detection_op(out[0], out[1], out[2], "horizontal_flip", {"flip": [hflip]})
                        want.append(_native.detection_op(out[0], out[1], out[2], "sanitize_bounding_boxes",
                                                         SANITIZE)[1:3])
                    self.assertIn((boxes, labels), want, f"image {image_id} (hflip {hflip}): not a crop of its image "
                                  f"with the boxes the crop keeps ({len(want)} places it matches)")
            self.assertGreater(cropped, 10)


if __name__ == "__main__":
    unittest.main()
