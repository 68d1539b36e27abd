# audit-deps: python .venv-torch2
"""The detection transforms that change an image's size at random (issue 47) against torchvision:
- ScaleJitter and RandomShortestSize against transforms.v2's own classes: crucible's size for a
  draw equals make_params' for the same torch.rand / torch.randint value (torchvision's float32
  and double arithmetic and int() truncations), its pixels and boxes equal the v2 transform's given
  the same size (bytes and float32 exactly), and its draws follow make_params' law (KS on the
  jittered size, chi-square on the chosen min_size);
- FixedSizeCrop against the class of torchvision's references/detection/transforms.py (in no
  package: the module torchvision_references_detection_transforms, that file, where
  CRUCIBLE_TORCHVISION_REFERENCES puts it; skipped, counted, elsewhere): the same image, boxes and kept labels when its
  torch.rand(1) returns crucible's draw, on uint8 tensors (fill a number: the references' tensor
  pad takes no tuple) and on PIL images (fill the "lsj" preset's mean, as the references' default
  PIL backend runs it); and its offsets' law: ONE torch.rand(1) moves top and left together, so the
  chi-square is on the (top, left) pair;
- the "lsj" and "multiscale" presets through the loader: every lsj image is data.lsj_size square
  with its boxes inside, every multiscale image has a size make_params can give its source image.
Each law comparison rejects at p < P_MIN and shows its power by rejecting a planted wrong sampler.
"""
import os
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch

import crucible
from crucible import _native
from oracle import TV2, needs_reference, needs_v2
from test_distributions import chi2_2samp, ks_2samp

# references/detection/transforms.py of pytorch/vision at 3749cad2d6a3d3ee976c15d48e30afe987642cb6, as the
# module torchvision_references_detection_transforms (oracle.needs_reference says how to provide it).
_reference = needs_reference("torchvision_references_detection_transforms",
                             "FixedSizeCrop against torchvision's references/detection/transforms.py")
try:
    import torchvision_references_detection_transforms as REFERENCES  # audit-deps: ignore (in no package)
except ImportError:
    REFERENCES = None

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_SET = os.path.join(HERE, "..", "..", "scripts", "make-detection-set")
P_MIN = 1e-6
N_LAW = 20000
MULTISCALE = [480 + 32 * i for i in range(11)]  # the references' multiscale min_size


def random_sample(rng, h, w, n_boxes, outside=0.25):
    """A [3, h, w] uint8 image and n XYXY float32 boxes, some reaching past the image."""
    image = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
    x1 = rng.uniform(-outside * w, w, n_boxes)
    y1 = rng.uniform(-outside * h, h, n_boxes)
    boxes = np.stack([x1, y1, x1 + rng.uniform(0, w, n_boxes), y1 + rng.uniform(0, h, n_boxes)], 1)
    return image, boxes.astype(np.float32).tolist(), list(range(n_boxes))


def v2_pair(image, boxes):
    from torchvision import tv_tensors
    h, w = image.shape[1:]
    return (tv_tensors.Image(torch.from_numpy(image)),
            tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY",
                                     canvas_size=(h, w)))


def blank(h, w):
    """An image of the size only (make_params reads nothing else): one byte, expanded."""
    from torchvision import tv_tensors
    return tv_tensors.Image(torch.zeros((1, 1, 1), dtype=torch.uint8).expand(3, h, w))


def rand_returning(u):
    """torch.rand, replaced for one call of torchvision's code by crucible's draw `u`."""
    def rand(*size, **kwargs):
        assert size in ((1,), ((1,),)), f"torchvision drew torch.rand{size}, crucible drew one value"
        return torch.tensor([u], dtype=torch.float32)
    return rand


def no_rand(*size, **kwargs):
    raise AssertionError("torchvision drew where crucible drew nothing")


def boxes_tensor(boxes):
    return torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)


class Checks(unittest.TestCase):
    def assert_same_sample(self, got, want_image, want_boxes, want_kept, what):
        got_image, got_boxes, _, got_ids = got
        self.assertEqual(got_image.shape, want_image.shape, f"{what}: size")
        diff = np.argwhere(got_image != want_image)
        self.assertEqual(len(diff), 0, f"{what}: {len(diff)} pixels differ, first at [c, y, x] = "
                                       f"{diff[:1].tolist()}")
        got_b, want_b = boxes_tensor(got_boxes), want_boxes.reshape(-1, 4)
        self.assertTrue(torch.equal(got_b, want_b), f"{what}: boxes {got_b.tolist()} vs {want_b.tolist()}")
        self.assertEqual(list(got_ids), list(want_kept), f"{what}: kept boxes")

    def assert_same_law(self, name, p, wrong_p):
        print(f"\n  {name}: p = {p:.3g} (crucible vs torchvision); planted wrong sampler p = {wrong_p:.3g}")
        self.assertGreater(p, P_MIN, f"{name}: crucible's draws follow another law than torchvision's (p = {p:.2e})")
        self.assertLess(wrong_p, P_MIN, f"{name}: the planted wrong sampler went unnoticed (p = {wrong_p:.2e})")


@needs_v2("ScaleJitter against transforms.v2.ScaleJitter")
class ScaleJitterAgainstV2(Checks):
    def draw(self, image, index, target, scale_range, seed=7):
        return _native.detection_draw("scale_jitter", seed, 0, index, image, [], [],
                                      {"target_size": list(target), "scale_range": list(scale_range)})

    def test_size_equals_make_params_for_the_same_rand(self):
        # Sizes, targets (neither square nor 1024 only: target[0] is against the width) and ranges
        # where a float32 ulp or the truncation order moves the size by a pixel.
        rng = np.random.default_rng(1)
        for i in range(1500):
            h, w = int(rng.integers(1, 1500)), int(rng.integers(1, 1500))
            target = (int(rng.integers(1, 2048)), int(rng.integers(1, 2048)))
            scale_range = [(0.1, 2.0), (0.8, 1.25), (0.5, 0.5), tuple(sorted(rng.uniform(0.05, 3, 2)))][i % 4]
            image = np.zeros((1, h, w), np.uint8)  # the draw reads the size only
            d = self.draw(image, i, target, scale_range)
            with mock.patch.object(torch, "rand", rand_returning(d["rand"][0])):
                want = TV2.ScaleJitter(target, scale_range).make_params([blank(h, w)])["size"]
            self.assertEqual([int(v) for v in d["size"]], list(want),
                             f"{w}x{h}, target {target}, scale {scale_range}, rand {d['rand'][0]!r}")

    def test_pixels_and_boxes_equal_v2_given_the_size(self):
        rng = np.random.default_rng(2)
        for i in range(40):
            h, w = int(rng.integers(4, 90)), int(rng.integers(4, 90))
            image, boxes, labels = random_sample(rng, h, w, int(rng.integers(0, 6)), outside=0)
            target = (int(rng.integers(16, 160)), int(rng.integers(16, 160)))
            d = self.draw(image, i, target, (0.1, 2.0))
            size = tuple(int(v) for v in d["size"])
            if min(size) < 1:
                continue
            got = _native.detection_op(image, boxes, labels, "scale_jitter", {"size": list(d["size"])})
            t = TV2.ScaleJitter(target)
            t.make_params = lambda flat_inputs, size=size: {"size": size}
            want_image, want_boxes = t(*v2_pair(image, boxes))
            self.assert_same_sample(got, want_image.numpy(), want_boxes.as_subclass(torch.Tensor), labels,
                                    f"ScaleJitter {w}x{h} -> {size}")

    def test_draws_follow_make_params_law_D14(self):
        # A small image and a large target: the jittered height takes ~8000 values, near continuous.
        h, w, target = 60, 80, (4096, 4096)
        image = np.zeros((3, h, w), np.uint8)
        ours = [self.draw(image, i, target, (0.1, 2.0))["size"][0] for i in range(N_LAW)]
        torch.manual_seed(0)
        theirs = [TV2.ScaleJitter(target).make_params([blank(h, w)])["size"][0] for _ in range(N_LAW)]
        # Planted: the scale range 5% wider, (0.1, 2.1).
        wrong = [TV2.ScaleJitter(target, (0.1, 2.1)).make_params([blank(h, w)])["size"][0] for _ in range(N_LAW)]
        self.assert_same_law("ScaleJitter height (KS)", ks_2samp(ours, theirs)[1], ks_2samp(wrong, theirs)[1])


@needs_v2("RandomShortestSize against transforms.v2.RandomShortestSize")
class RandomShortestSizeAgainstV2(Checks):
    def draw(self, image, index, min_size, max_size, seed=11):
        return _native.detection_draw("random_shortest_size", seed, 0, index, image, [], [],
                                      {"min_size": list(min_size), "max_size": [max_size or 0]})

    def test_size_equals_make_params_for_the_same_choice(self):
        rng = np.random.default_rng(3)
        for i in range(1500):
            h, w = int(rng.integers(1, 1500)), int(rng.integers(1, 1500))
            min_size = [int(v) for v in rng.integers(1, 1200, int(rng.integers(1, 12)))]
            max_size = None if i % 3 == 0 else int(rng.integers(1, 2000))
            image = np.zeros((1, h, w), np.uint8)  # the draw reads the size only
            d = self.draw(image, i, min_size, max_size)
            chosen = int(d["min_size"][0])
            index = min_size.index(chosen)
            with mock.patch.object(torch, "randint", lambda n, size, **k: torch.tensor(index)):
                want = TV2.RandomShortestSize(min_size, max_size).make_params([blank(h, w)])["size"]
            self.assertEqual([int(v) for v in d["size"]], list(want),
                             f"{w}x{h}, min_size {chosen}, max_size {max_size}")

    def test_pixels_and_boxes_equal_v2_given_the_size(self):
        rng = np.random.default_rng(4)
        for i in range(40):
            h, w = int(rng.integers(4, 90)), int(rng.integers(4, 90))
            image, boxes, labels = random_sample(rng, h, w, int(rng.integers(0, 6)), outside=0)
            min_size, max_size = [8, 24, 40, 64], 100
            d = self.draw(image, i, min_size, max_size)
            size = tuple(int(v) for v in d["size"])
            got = _native.detection_op(image, boxes, labels, "random_shortest_size", {"size": list(d["size"])})
            t = TV2.RandomShortestSize(min_size, max_size)
            t.make_params = lambda flat_inputs, size=size: {"size": size}
            want_image, want_boxes = t(*v2_pair(image, boxes))
            self.assert_same_sample(got, want_image.numpy(), want_boxes.as_subclass(torch.Tensor), labels,
                                    f"RandomShortestSize {w}x{h} -> {size}")

    def test_choice_follows_make_params_law_D14(self):
        # A square image without a cap: the output height is the chosen min_size.
        image = np.zeros((3, 100, 100), np.uint8)
        ours = [self.draw(image, i, MULTISCALE, None)["size"][0] for i in range(N_LAW)]
        torch.manual_seed(0)
        theirs = [TV2.RandomShortestSize(MULTISCALE).make_params([blank(100, 100)])["size"][0] for _ in range(N_LAW)]
        # Planted: an off-by-one that never picks the last size (800).
        wrong = [TV2.RandomShortestSize(MULTISCALE[:-1]).make_params([blank(100, 100)])["size"][0]
                 for _ in range(N_LAW)]
        self.assert_same_law("RandomShortestSize choice (chi2)", chi2_2samp(ours, theirs)[2],
                             chi2_2samp(wrong, theirs)[2])


@_reference
class FixedSizeCropAgainstReferences(Checks):
    def draw(self, image, index, size, seed=5):
        return _native.detection_draw("fixed_size_crop", seed, 0, index, image, [], [], {"size": list(size)})

    def run_both(self, rng, index, size, fill, pil):
        """crucible's fixed_size_crop and the references' FixedSizeCrop on one random sample."""
        from PIL import Image
        h, w = int(rng.integers(1, 2 * size[0])), int(rng.integers(1, 2 * size[1]))
        image, boxes, labels = random_sample(rng, h, w, int(rng.integers(0, 8)))
        d = self.draw(image, index, size)
        params = {"size": list(size), "fill": list(fill) if isinstance(fill, tuple) else [fill], **d}
        got = _native.detection_op(image, boxes, labels, "fixed_size_crop", params)
        target = {"boxes": boxes_tensor(boxes), "labels": torch.tensor(labels, dtype=torch.int64)}
        inpt = Image.fromarray(image.transpose(1, 2, 0)) if pil else torch.from_numpy(image.copy())
        rand = rand_returning(d["rand"][0]) if "rand" in d else no_rand
        with mock.patch.object(torch, "rand", rand):
            out, target = REFERENCES.FixedSizeCrop(size, fill=fill)(inpt, target)
        want = np.asarray(out).transpose(2, 0, 1) if pil else out.numpy()
        self.assert_same_sample(got, want, target["boxes"], target["labels"].tolist(),
                                f"FixedSizeCrop {w}x{h} to {size} ({'PIL' if pil else 'tensor'}), draws {d}")

    def test_uint8_tensor_equals_references(self):
        rng = np.random.default_rng(6)
        for i in range(300):
            size = (int(rng.integers(1, 64)), int(rng.integers(1, 64)))
            self.run_both(rng, i, size, fill=[0, 105, 255][i % 3], pil=False)

    def test_pil_with_the_presets_mean_equals_references(self):
        # The lsj preset's FixedSizeCrop(fill=mean) on the references' default (PIL) backend: the
        # only one whose pad takes a colour.
        rng = np.random.default_rng(7)
        for i in range(300):
            size = (int(rng.integers(1, 64)), int(rng.integers(1, 64)))
            self.run_both(rng, i, size, fill=(123.0, 117.0, 104.0), pil=True)

    def test_offsets_follow_the_references_law_D14(self):
        # Value y * W + x at each pixel: the output's first pixel says where the crop began.
        h, w, size = 40, 50, (30, 30)
        image = np.zeros((3, h, w), np.uint8)
        ours = []
        for i in range(N_LAW):
            d = self.draw(image, i, size)
            ours.append((int(d["top"][0]), int(d["left"][0])))
        where = torch.arange(h * w, dtype=torch.int64).reshape(1, h, w)
        crop = REFERENCES.FixedSizeCrop(size)
        torch.manual_seed(0)
        theirs = [divmod(int(crop(where)[0][0, 0, 0]), w) for _ in range(N_LAW)]
        # Planted: top and left drawn apart (two torch.rand values), as a reading of "random crop" has it.
        wrong = [(int(10 * float(torch.rand(1))), int(20 * float(torch.rand(1)))) for _ in range(N_LAW)]
        self.assert_same_law("FixedSizeCrop (top, left) (chi2)", chi2_2samp(ours, theirs)[2],
                             chi2_2samp(wrong, theirs)[2])


def make_set(root, train=12, seed=3):
    subprocess.run([MAKE_SET, root, "--train", str(train), "--val", "2", "--seed", str(seed)], check=True)
    return os.path.join(root, "annotations", "instances_train.json")


def loader_samples(path, train, **settings):
    """[(image [C, H, W], target)] of every sample, one epoch, through crucible's loader."""
    out = []
    with crucible.ImageLoader(path, batch_size=3, train=train, threads=2, settings=settings) as loader:
        for images, targets in loader:
            out += [(image.clone(), t) for image, t in zip(images, targets)]
    return out


class PresetsThroughTheLoader(unittest.TestCase):
    def test_lsj_gives_squares_of_data_lsj_size_with_boxes_inside(self):
        with tempfile.TemporaryDirectory() as d:
            samples = loader_samples(make_set(d), True, **{"data.detection_preset": "lsj", "data.lsj_size": 48})
            self.assertEqual(len(samples), 12)
            for image, t in samples:
                self.assertEqual(tuple(image.shape), (3, 48, 48), t["image_id"])
                b = t["boxes"]
                self.assertTrue(bool(((b >= 0) & (b <= 48)).all()), (t["image_id"], b))
                self.assertTrue(bool(((b[:, 2:] - b[:, :2]) >= 1).all()), (t["image_id"], b))  # sanitized

    @needs_v2("the multiscale preset's sizes against v2.RandomShortestSize.make_params")
    def test_multiscale_sizes_are_those_make_params_gives(self):
        with tempfile.TemporaryDirectory() as d:
            path = make_set(d)
            source = {t["image_id"]: tuple(image.shape[1:]) for image, t in loader_samples(path, False)}
            samples = loader_samples(path, True, **{"data.detection_preset": "multiscale"})
            self.assertEqual(len(samples), len(source))
            for image, t in samples:
                h, w = source[t["image_id"]]
                possible = set()
                for index in range(len(MULTISCALE)):
                    with mock.patch.object(torch, "randint", lambda n, size, **k: torch.tensor(index)):
                        possible.add(tuple(TV2.RandomShortestSize(MULTISCALE, 1333).make_params([blank(h, w)])["size"]))
                self.assertIn(tuple(image.shape[1:]), possible, f"image {t['image_id']} of {w}x{h}")


if __name__ == "__main__":
    unittest.main()
