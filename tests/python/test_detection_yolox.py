# audit-deps: python .venv-torch2
"""The YOLOX pipeline (issue 47, yolox.h) against the `yolox` package 0.3.0's own functions
(yolox/data/data_augment.py, datasets/mosaicdetection.py, datasets/coco.py) with OpenCV 4.x:

- every operation given the same draws: crucible's op (detection_op) with its params, and yolox's
  function with Python's random and numpy's np.random patched to hand out, value for value, the
  list crucible's draw recorded (`replayed`: a call in another order, with another range or one
  draw too many or too few fails the test). Images are RGB in crucible and BGR in yolox; each side
  is compared in its own order.
- pixels byte for byte (OpenCV's fixed-point resize and warpAffine and its uint8 HSV reproduced:
  the bound is 0 levels); boxes exact: crucible's float32 box equals yolox's float64 box rounded to
  float32. TrainTransform hands out boxes as (cx, cy, w, h); crucible keeps xyxy: its xyxy equals
  TrainTransform's own xyxy just before it converts them (recorded) times preproc's r, as its
  `boxes *= r_`, and yolox's cxcywh is compared with crucible's boxes converted by yolox's
  xyxy2cxcywh within CXCYWH_ATOL (one float32 rounding of each side).
- the samples yolox reads come through COCODataset's own pull_item, load_anno and
  load_resized_img over an in-memory pycocotools stand-in (FakeCOCO): crowd boxes dropped, the
  image fitted to the input size.
- the whole training transform (the "yolox" preset's, op yolox_train: MosaicDetection.__getitem__
  with TrainTransform) on a small data set, mosaic on and off; and the preset through the Python
  loader (PresetTest, no oracle: squares, thread counts, the letterbox when nothing is drawn).
- draws: crucible's laws against yolox's own samplers (its random and np.random calls, recorded
  unpatched): KS for continuous draws, chi-square for discrete ones (test_distributions.py's
  helpers), each rejecting at p < P_MIN and showing its power by rejecting a planted wrong sampler.
  At most MAX_COMPARISONS = 12 comparisons of crucible's draws per run: a family false-alarm rate
  of at most 12 × P_MIN = 1.2e-5.
"""
import contextlib
import random
import unittest
from unittest import mock

import numpy as np

from crucible import _native
from oracle import needs_module
from test_distributions import LawTest

try:
    import cv2  # noqa: F401  (yolox's own OpenCV)
    import yolox.data.data_augment as DA
    import yolox.data.datasets.mosaicdetection as MD
    from yolox.data.datasets.coco import COCODataset
    from yolox.data.datasets.datasets_wrapper import Dataset as YoloxDataset
    from yolox.utils import adjust_box_anns, xyxy2cxcywh
except ImportError:  # Debian's python: the classes below skip (make test) or fail (make test-torch2)
    DA = MD = COCODataset = YoloxDataset = None

P_MIN = 1e-6
MAX_COMPARISONS = 12
_COMPARED = []
CXCYWH_ATOL = 2.5e-4  # two float32 roundings at 640 (ulp 6.1e-5) and the conversion's own
N_LAW = 20000


def tearDownModule():
    assert len(_COMPARED) <= MAX_COMPARISONS, (
        f"{len(_COMPARED)} comparisons: raise MAX_COMPARISONS and the docstring's false-alarm rate with them")


# ---- the two sides ----------------------------------------------------------------------------

def chw(img):
    return np.ascontiguousarray(img.transpose(2, 0, 1))


def ours(op, img, boxes, labels, params):
    """crucible's op on an RGB [H, W, 3] image: (RGB image, float32 [n, 4] boxes, labels, ids)."""
    im, b, l, ids = _native.detection_op(chw(img), [[float(v) for v in x] for x in boxes], [int(v) for v in labels],
                                         op, params)
    return np.asarray(im).transpose(1, 2, 0), np.array(b, np.float32).reshape(-1, 4), list(l), list(ids)


def draw(op, seed, img, boxes, labels, settings, index=0, epoch=0):
    return _native.detection_draw(op, seed, epoch, index, chw(img), [[float(v) for v in x] for x in boxes],
                                  [int(v) for v in labels], settings)


def bgr(img):
    return np.ascontiguousarray(img[..., ::-1])


def targets(boxes, labels):
    """yolox's [n, 5] float64 targets: x1, y1, x2, y2, class."""
    t = np.zeros((len(boxes), 5))
    if len(boxes):
        t[:, :4] = np.asarray(boxes, np.float32)
        t[:, 4] = labels
    return t


def sample_params(k, img, boxes, labels, crowd=None):
    """A sample handed to an op that reads others (ops mosaic, mixup, train): image<k> and the rest."""
    p = {f"image{k}": img.reshape(-1).astype(np.float64).tolist(), f"shape{k}": [img.shape[0], img.shape[1]],
         f"boxes{k}": np.asarray(boxes, np.float64).reshape(-1).tolist(), f"labels{k}": [float(v) for v in labels]}
    if crowd is not None:
        p[f"crowd{k}"] = [float(v) for v in crowd]
    return p


@contextlib.contextmanager
def replayed(values):
    """Python's random and numpy's np.random as yolox calls them, handing out `values` in order;
    each value is checked against the range the call asks for, and every value must be used."""
    values = [float(v) for v in values]
    at = [0]

    def take(what, lo, hi, high_open):
        if at[0] >= len(values):
            raise AssertionError(f"yolox's {what} asked for draw {at[0] + 1}; crucible made {len(values)}")
        v = values[at[0]]
        at[0] += 1
        if not (lo <= v < hi if high_open else lo <= v <= hi):
            raise AssertionError(f"yolox's {what}({lo}, {hi}) handed crucible's draw {v}, outside its range")
        return v

    def np_uniform(low=0.0, high=1.0, size=None):
        if size is None:
            return take("np.random.uniform", low, high, False)
        return np.array([take("np.random.uniform", low, high, False) for _ in range(size)])

    def np_randint(low, high=None, size=None):
        if size is None:
            return int(take("np.random.randint", low, high, True))
        return np.array([int(take("np.random.randint", low, high, True)) for _ in range(size)])

    with mock.patch("random.random", lambda: take("random.random", 0.0, 1.0, True)), \
            mock.patch("random.uniform", lambda a, b: take("random.uniform", min(a, b), max(a, b), False)), \
            mock.patch("random.randint", lambda a, b: int(take("random.randint", a, b, False))), \
            mock.patch("numpy.random.uniform", np_uniform), mock.patch("numpy.random.randint", np_randint):
        yield
    assert at[0] == len(values), f"yolox used {at[0]} of crucible's {len(values)} draws"


class FakeApi:
    """The three pycocotools.COCO calls COCODataset makes, over in-memory boxes (integers: COCO's
    x, y, w, h then give back the same xyxy)."""

    def __init__(self, sizes, boxes, labels, crowd):
        self.sizes, self.boxes, self.labels, self.crowd = sizes, boxes, labels, crowd

    def loadImgs(self, id_):
        h, w = self.sizes[id_]
        return [{"width": w, "height": h, "file_name": f"{id_}.jpg"}]

    def getAnnIds(self, imgIds, iscrowd=None):
        i = imgIds[0]
        return [(i, j) for j in range(len(self.boxes[i])) if not (iscrowd is False and self.crowd[i][j])]

    def loadAnns(self, ids):
        out = []
        for i, j in ids:
            x1, y1, x2, y2 = (float(v) for v in self.boxes[i][j])
            out.append({"bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                        "category_id": int(self.labels[i][j]) + 1})
        return out


if COCODataset is not None:
    class FakeCOCO(COCODataset):
        """COCODataset over in-memory RGB images (handed to yolox as BGR): its own load_anno_from_ids,
        load_anno, load_resized_img and pull_item run, only the files are not read."""

        def __init__(self, images, boxes, labels, crowd, img_size, classes=10):
            YoloxDataset.__init__(self, img_size)
            self.images = [bgr(im) for im in images]
            self.coco = FakeApi([im.shape[:2] for im in images], boxes, labels, crowd)
            self.ids = list(range(len(images)))
            self.class_ids = list(range(1, classes + 1))
            self.imgs, self.img_size, self.preproc, self.name, self.data_dir = None, img_size, None, "", ""
            self.annotations = self._load_coco_annotations()

        def load_image(self, index):
            return self.images[index]

    class Float32COCO(FakeCOCO):
        """FakeCOCO whose pull_item boxes are rounded to float32: what an op test hands crucible (its
        own sample's boxes are float32), so that both sides start from the same numbers."""

        def pull_item(self, index):
            img, res, info, id_ = super().pull_item(index)
            res[:, :4] = res[:, :4].astype(np.float32)
            return img, res, info, id_


def random_boxes(rng, n, w, h, integer=False, min_side=1):
    x1 = rng.uniform(0, w - min_side, n)
    y1 = rng.uniform(0, h - min_side, n)
    x2 = np.minimum(x1 + rng.uniform(min_side, max(min_side + 1, w / 2), n), w)
    y2 = np.minimum(y1 + rng.uniform(min_side, max(min_side + 1, h / 2), n), h)
    b = np.stack([x1, y1, x2, y2], 1)
    if integer:
        b = np.floor(b)
        b[:, 2:] = np.maximum(b[:, 2:], b[:, :2] + 1)
    return b.astype(np.float32)


def random_image(rng, h, w):
    """Noise with flat patches and grey rows (the HSV conversion's ties and s = 0)."""
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img[: h // 4, : w // 4] = img[0, 0]
    img[h // 2: h // 2 + 2] = img[h // 2: h // 2 + 2, :, :1]
    return img


class Exact(unittest.TestCase):
    def assert_pixels(self, what, mine, theirs):
        self.assertEqual(mine.shape, theirs.shape, f"{what}: shapes")
        d = np.abs(mine.astype(np.int32) - theirs.astype(np.int32))
        self.assertEqual(int(d.max(initial=0)), 0,
                         f"{what}: {int((d > 0).sum())} levels differ, by up to {int(d.max(initial=0))}; first at "
                         f"{np.argwhere(d > 0)[:3].tolist()}")

    def assert_boxes(self, what, mine, theirs):
        theirs = np.asarray(theirs, np.float64).reshape(-1, 4).astype(np.float32)
        self.assertEqual(mine.shape, theirs.shape, f"{what}: box count")
        bad = np.argwhere(mine != theirs)
        self.assertEqual(len(bad), 0, f"{what}: {len(bad)} coordinates differ, first {bad[:3].tolist()}: "
                                      f"{mine[tuple(bad[0])] if len(bad) else ''} vs {theirs[tuple(bad[0])] if len(bad) else ''}")


class Law(LawTest):
    compared = _COMPARED  # this module's family of comparisons
    oracle = "yolox"


# ---- letterbox and pull_item: OpenCV's resize ----------------------------------------------------

@needs_module("yolox", "YOLOX's letterbox (preproc) and COCODataset.pull_item against yolox")
class LetterboxTest(Exact):
    SIZES = [((1280, 1280), (640, 640)), ((1280, 960), (640, 480)), ((480, 640), (640, 640)), ((100, 100), (640, 640)),
             ((375, 500), (416, 416)), ((640, 640), (640, 640)), ((7, 470), (640, 640)), ((641, 639), (320, 320))]

    def cases(self):
        rng = np.random.default_rng(47)
        sizes = list(self.SIZES)
        for _ in range(40):
            h, w = (int(v) for v in rng.integers(20, 900, 2))
            ih, iw = (int(v) for v in rng.integers(32, 800, 2))
            sizes.append(((h, w), (ih, iw)))
        for (h, w), (ih, iw) in sizes:
            img = random_image(rng, h, w)
            boxes = random_boxes(rng, 6, w, h, integer=True)
            yield img, boxes, rng.integers(0, 10, len(boxes)), (ih, iw)

    def test_preproc(self):
        worst = 0
        for img, boxes, labels, (ih, iw) in self.cases():
            mine, mb, ml, _ = ours("yolox_preproc", img, boxes, labels, {"size": [ih, iw]})
            padded, r = DA.preproc(bgr(img), (ih, iw))  # CHW float32, BGR
            theirs = bgr(padded.transpose(1, 2, 0).astype(np.uint8))
            worst = max(worst, int(np.abs(mine.astype(int) - theirs).max()))
            what = f"preproc {img.shape[:2]} into {(ih, iw)}"
            self.assert_pixels(what, mine, theirs)
            # TrainTransform scales its boxes by preproc's r; adjust_box_anns is yolox's box scaling.
            self.assert_boxes(what, mb, adjust_box_anns(targets(boxes, labels)[:, :4], r, 0, 0, np.inf, np.inf))
            self.assertEqual(ml, list(labels))
        print(f"  preproc: largest level difference {worst}")

    def test_pull_item(self):
        for img, boxes, labels, (ih, iw) in self.cases():
            mine, mb, ml, _ = ours("yolox_fit", img, boxes, labels, {"size": [ih, iw]})
            ds = FakeCOCO([img], [boxes], [labels], [[0] * len(boxes)], (ih, iw))
            im, res, _, _ = ds.pull_item(0)
            what = f"pull_item {img.shape[:2]} for {(ih, iw)}"
            self.assert_pixels(what, mine, bgr(im))
            self.assert_boxes(what, mb, res[:, :4])
            self.assertEqual(ml, [int(v) for v in res[:, 4]])


# ---- augment_hsv: OpenCV's uint8 HSV ---------------------------------------------------------------

def hsv_replay(gains, full=(5, 30, 30)):
    """np.random.uniform and randint values for which augment_hsv computes `gains`."""
    u = [(g + (0.5 if g >= 0 else -0.5)) / f for g, f in zip(gains, full)]
    return u + [1, 1, 1]


@needs_module("yolox", "YOLOX's augment_hsv against yolox")
class AugmentHsvTest(Exact, Law):
    def test_every_colour(self):
        """All 2^24 colours (BGR2HSV on every input) under several gains, the wrap of H included."""
        a = np.arange(256, dtype=np.uint8)
        r, g, b = np.meshgrid(a, a, a, indexing="ij")
        img = np.stack([r, g, b], -1).reshape(4096, 4096, 3)
        for gains in [(0, 0, 0), (4, -29, 29), (-4, 29, -29), (3, 17, -5), (-1, -3, 12)]:
            mine, _, _, _ = ours("yolox_augment_hsv", img, [], [], {"gains": list(gains)})
            theirs = bgr(img)
            with replayed(hsv_replay(gains)):
                DA.augment_hsv(theirs)
            self.assert_pixels(f"augment_hsv{gains} on every colour", mine, bgr(theirs))

    def test_draws_and_widths(self):
        """crucible's draws handed to yolox; widths that are and are not multiples of OpenCV's
        64-pixel step (its vector loop truncates, its scalar tail rounds)."""
        rng = np.random.default_rng(5)
        widths = [1, 2, 63, 64, 65, 127, 128, 129, 200, 640] + [int(v) for v in rng.integers(1, 300, 10)]
        for seed, w in enumerate(widths):
            img = random_image(rng, int(rng.integers(1, 40)), w)
            d = draw("yolox_augment_hsv", seed, img, [], [], {"gain": [5, 30, 30]})
            mine, _, _, _ = ours("yolox_augment_hsv", img, [], [], d)
            theirs = bgr(img)
            with replayed(d["draws"]):
                DA.augment_hsv(theirs)
            self.assert_pixels(f"augment_hsv (seed {seed}, gains {d['gains']}, width {w})", mine, bgr(theirs))

    def test_law_D14(self):
        """The gains' law: yolox's own np.random through augment_hsv (a stand-in cv2 reads the
        shifted HSV of one pixel) against crucible's draws."""
        np.random.seed(47)
        theirs = []
        seen = {}

        class Cv2:
            COLOR_BGR2HSV, COLOR_HSV2BGR = 40, 54

            @staticmethod
            def cvtColor(img, code, dst=None):
                if code == Cv2.COLOR_BGR2HSV:
                    return np.array([[[90, 128, 128]]], np.uint8)
                seen["hsv"] = img.astype(int)[0, 0]
                return dst

        with mock.patch.object(DA, "cv2", Cv2):
            for _ in range(N_LAW):
                DA.augment_hsv(np.zeros((1, 1, 3), np.uint8))
                h, s, v = seen["hsv"]
                theirs.append((h - 90, s - 128, v - 128))
        img = np.zeros((1, 1, 3), np.uint8)
        mine, planted = [], []
        for seed in range(N_LAW):
            d = draw("yolox_augment_hsv", seed, img, [], [], {"gain": [5, 30, 30]})
            mine.append(tuple(int(g) for g in d["gains"]))
            # planted: rounded instead of truncated (astype(int16) truncates)
            planted.append(tuple(int(np.round(u * f * s)) for u, f, s in zip(d["uniform"], (5, 30, 30), d["select"])))
        for c, name in ((0, "H"), (2, "V")):
            self.same_law(f"augment_hsv {name} gain", [m[c] for m in mine], [t[c] for t in theirs], "chi2")
            self.rejects(f"augment_hsv {name} gain rounded", [m[c] for m in planted], [t[c] for t in theirs], "chi2")


# ---- random_affine: OpenCV's warpAffine, the boxes' corners --------------------------------------

AFFINE = {"degrees": [10.0], "translate": [0.1], "scale": [0.1, 2.0], "shear": [2.0]}


@needs_module("yolox", "YOLOX's random_affine against yolox")
class RandomAffineTest(Exact, Law):
    def test_given_draws(self):
        rng = np.random.default_rng(11)
        cases = [((1280, 1280), (640, 640)), ((640, 640), (320, 320)), ((333, 517), (256, 416)), ((64, 64), (300, 200))]
        for _ in range(12):
            cases.append((tuple(int(v) for v in rng.integers(30, 700, 2)), tuple(int(v) for v in rng.integers(30, 500, 2))))
        for seed, ((h, w), (th, tw)) in enumerate(cases):
            img = random_image(rng, h, w)
            boxes = random_boxes(rng, 12, w, h)
            boxes[0] = [0, 0, w, h]  # the whole image: its corners leave the target
            labels = rng.integers(0, 80, len(boxes))
            d = draw("yolox_random_affine", seed, img, boxes, labels, AFFINE)
            self.compare(img, boxes, labels, d, (tw, th), f"seed {seed}, {w}x{h} to {tw}x{th}")

    def test_edges(self):
        """The identity, the largest and smallest scales, a rotation by a right angle."""
        rng = np.random.default_rng(12)
        img = random_image(rng, 200, 300)
        boxes = random_boxes(rng, 8, 300, 200)
        labels = list(range(8))
        for angle, scale, shear, t in [(0, 1, 0, 0), (0, 2, 0, 0.1), (0, 0.1, 0, -0.1), (90, 1, 0, 0), (-10, 1.3, 2, 0.05)]:
            d = {"angle": [angle], "scale": [scale], "shear_x": [shear], "shear_y": [-shear], "translate_x": [t],
                 "translate_y": [t], "draws": [angle, scale, shear, -shear, t, t]}
            self.compare(img, boxes, labels, d, (300, 200), f"angle {angle} scale {scale} shear {shear} t {t}",
                         degrees=90.0)

    def compare(self, img, boxes, labels, d, target, what, degrees=10.0):
        mine, mb, ml, _ = ours("yolox_random_affine", img, boxes, labels, {**d, "target": list(target)})
        with replayed(d["draws"]):
            theirs, tt = DA.random_affine(bgr(img), targets(boxes, labels), target_size=target, degrees=degrees,
                                          translate=0.1, scales=(0.1, 2.0), shear=2.0)
        self.assert_pixels(f"random_affine {what}", mine, bgr(theirs))
        self.assert_boxes(f"random_affine {what}", mb, tt[:, :4])
        self.assertEqual(ml, [int(v) for v in tt[:, 4]])

    def test_law_D14(self):
        random.seed(47)
        theirs = []
        real = random.uniform
        with mock.patch("random.uniform", lambda a, b: theirs.append(real(a, b)) or theirs[-1]):
            for _ in range(3 * N_LAW):
                DA.get_affine_matrix((640, 640), 10.0, 0.1, (0.1, 2.0), 2.0)
        theirs = np.array(theirs).reshape(-1, 6)
        img = np.zeros((4, 4, 3), np.uint8)
        mine = np.array([draw("yolox_random_affine", s, img, [], [], AFFINE)["draws"] for s in range(3 * N_LAW)])
        self.assertEqual(mine.shape, theirs.shape, "six draws per matrix, as get_affine_matrix")
        self.same_law("random_affine angle", mine[:, 0], theirs[:, 0], "ks")
        self.rejects("angle in ±9.5 degrees", mine[:, 0] * 0.95, theirs[:, 0], "ks")
        self.same_law("random_affine scale", mine[:, 1], theirs[:, 1], "ks")
        self.rejects("scale in [0.15, 2.0)", 0.15 + (mine[:, 1] - 0.1) * (1.85 / 1.9), theirs[:, 1], "ks")
        # the two shears and the two translations: one law each, the pair's order being the matrix's
        self.same_law("random_affine shear and translation", np.concatenate([mine[:, 2:4].ravel(), 20 * mine[:, 4:].ravel()]),
                      np.concatenate([theirs[:, 2:4].ravel(), 20 * theirs[:, 4:].ravel()]), "ks")
        self.rejects("a translation in ±0.095", np.concatenate([mine[:, 2:4].ravel(), 19 * mine[:, 4:].ravel()]),
                     np.concatenate([theirs[:, 2:4].ravel(), 20 * theirs[:, 4:].ravel()]), "ks")


# ---- mosaic and mixup: MosaicDetection -------------------------------------------------------------

def dataset(rng, n, img_size, sizes=None, with_empty=True, with_crowd=True, cls=None):
    """n RGB images with integer boxes (one without a box, one with a crowd box) and FakeCOCO over them."""
    images, boxes, labels, crowd = [], [], [], []
    for i in range(n):
        h, w = sizes[i] if sizes else (int(v) for v in rng.integers(60, 700, 2))
        images.append(random_image(rng, h, w))
        k = 0 if with_empty and i == n - 1 else int(rng.integers(1, 9))
        boxes.append(random_boxes(rng, k, w, h, integer=True, min_side=2))
        labels.append(rng.integers(0, 10, k))
        crowd.append([int(with_crowd and i == n - 2 and j == 0) for j in range(k)])
    return images, boxes, labels, crowd, (cls or FakeCOCO)(images, boxes, labels, crowd, img_size)


def pulled(ds, i):
    """pull_item's sample as crucible's RGB image, xyxy boxes and labels."""
    im, res, _, _ = ds.pull_item(i)
    return bgr(im), res[:, :4], res[:, 4].astype(int)


def mosaic_detection(ds, size, **kw):
    args = dict(img_size=(size, size), mosaic=True, preproc=lambda img, labels, dim: (img, labels), degrees=10.0,
                translate=0.1, mosaic_scale=(0.1, 2), mixup_scale=(0.5, 1.5), shear=2.0, enable_mixup=False)
    args.update(kw)
    return MD.MosaicDetection(ds, **args)


@needs_module("yolox", "YOLOX's mosaic and mixup against yolox")
class MosaicMixupTest(Exact, Law):
    def test_mosaic(self):
        """The canvas before random_affine (replaced by a recorder), tiles as pull_item gives them;
        square and not (MosaicDetection's canvas is its data set's input_dim)."""
        rng = np.random.default_rng(21)
        for ih, iw, fitted in ((320, 320, None), (300, 200, None), (640, 640, None), (256, 256, (300, 200))):
            images, boxes, labels, crowd, ds = dataset(rng, 5, fitted or (ih, iw), with_empty=True, cls=Float32COCO)
            ds._input_dim = (ih, iw)  # tiles fitted to another size: the mosaic resizes them again
            for seed in range(4):
                index = seed % 3
                img, bx, lb = pulled(ds, index)
                d = draw("yolox_mosaic", seed, img, bx, lb, {"prob": [1.0], "size": [5], "input": [ih, iw]})
                params = {"center": d["center"], "input": [ih, iw]}
                for k, i in enumerate(d["indices"], 1):
                    params.update(sample_params(k, *pulled(ds, int(i))))
                mine, mb, ml, _ = ours("yolox_mosaic", img, bx, lb, params)
                seen = {}

                def record(img, labels, **kw):
                    seen["img"], seen["labels"] = img.copy(), labels.copy()
                    return img, labels
                with mock.patch.object(MD, "random_affine", record), replayed(d["draws"]):
                    mosaic_detection(ds, ih)[index]
                what = f"mosaic {ih}x{iw} (seed {seed}, center {d['center']}, tiles {d['indices']})"
                self.assert_pixels(what, mine, bgr(seen["img"]))
                self.assert_boxes(what, mb, seen["labels"][:, :4])
                self.assertEqual(ml, [int(v) for v in seen["labels"][:, 4]])

    def test_mixup(self):
        rng = np.random.default_rng(22)
        for size in (320, 640, 416):
            images, boxes, labels, crowd, ds = dataset(rng, 4, (size, size), with_empty=False, with_crowd=False,
                                                       cls=Float32COCO)
            md = mosaic_detection(ds, size, enable_mixup=True)
            for seed in range(6):
                origin = random_image(rng, size, size)
                ob = random_boxes(rng, 5, size, size)
                ol = rng.integers(0, 10, 5)
                d = draw("yolox_mixup", seed, origin, ob, ol, {"scale": [0.5, 1.5], "size": [4], "input": [size, size]})
                cp = pulled(ds, int(d["index"][0]))
                params = {k: d[k] for k in ("jit", "flip", "offset")}
                mine, mb, ml, _ = ours("yolox_mixup", origin, ob, ol, {**params, "input": [size, size],
                                                                       **sample_params(1, *cp)})
                with replayed(d["draws"]):
                    theirs, tl = md.mixup(bgr(origin), targets(ob, ol), (size, size))
                what = f"mixup {size} (seed {seed}, jit {d['jit'][0]:.3f}, flip {d['flip'][0]}, offset {d['offset']})"
                self.assert_pixels(what, mine, bgr(theirs))
                self.assert_boxes(what, mb, tl[:, :4])
                self.assertEqual(ml, [int(v) for v in tl[:, 4]])

    def test_law_D14(self):
        """The centre and the tiles (MosaicDetection.__getitem__'s uniform and randint), and mixup's
        jit_factor, against yolox's own calls."""
        rng = np.random.default_rng(23)
        *_, ds = dataset(rng, 7, (64, 64), with_empty=False, with_crowd=False)
        random.seed(47)
        calls = []
        real_uniform, real_randint = random.uniform, random.randint
        with mock.patch("random.uniform", lambda a, b: calls.append(("u", real_uniform(a, b))) or calls[-1][1]), \
                mock.patch("random.randint", lambda a, b: calls.append(("i", real_randint(a, b))) or calls[-1][1]), \
                mock.patch.object(MD, "random_affine", lambda img, labels, **kw: (img, labels)):
            md = mosaic_detection(ds, 64)
            for i in range(N_LAW // 4):
                md[i % 7]
        theirs_center = [v for k, v in calls if k == "u"]
        theirs_tiles = [v for k, v in calls if k == "i"]
        img = np.zeros((4, 4, 3), np.uint8)
        mine_center, mine_tiles = [], []
        for s in range(N_LAW // 4):
            d = draw("yolox_mosaic", s, img, [], [], {"prob": [1.0], "size": [7], "input": [64, 64]})
            mine_center += [d["draws"][1], d["draws"][2]]
            mine_tiles += [int(v) for v in d["indices"]]
        self.same_law("mosaic centre", mine_center, theirs_center, "ks")
        self.rejects("a centre in [0.45 s, 1.5 s)", [0.95 * v + 0.05 * 32 for v in mine_center], theirs_center, "ks")
        self.same_law("mosaic tiles", mine_tiles, theirs_tiles, "chi2")
        self.rejects("tiles from randint(0, n - 2)", [min(v, 5) for v in mine_tiles], theirs_tiles, "chi2")


# ---- TrainTransform ----------------------------------------------------------------------------------

@contextlib.contextmanager
def train_recorder():
    """Records TrainTransform's boxes just before each xyxy2cxcywh and each preproc's r."""
    seen = {"xyxy": [], "r": []}
    real_convert, real_preproc = DA.xyxy2cxcywh, DA.preproc

    def convert(b):
        seen["xyxy"].append(b.copy())
        return real_convert(b)

    def preproc(img, input_size, swap=(2, 0, 1)):
        out, r = real_preproc(img, input_size, swap)
        seen["r"].append(r)
        return out, r
    with mock.patch.object(DA, "xyxy2cxcywh", convert), mock.patch.object(DA, "preproc", preproc):
        yield seen


def expected_xyxy(seen, rows):
    """The xyxy boxes behind TrainTransform's output rows [class, cx, cy, w, h]: its own boxes just
    before it converted them, times preproc's r as its `boxes *= r_` (not adjust_box_anns, which
    clips at 0: a box past the right edge is mirrored to a negative x1, in yolox as here); the rows
    pick them (each row is the float32 of yolox's own conversion of one of them, in order)."""
    if len(seen["r"]) == 2:  # none survived: the sample as it came, its boxes scaled by the second r
        return (seen["xyxy"][0] * seen["r"][1])[: len(rows)]
    every, r = seen["xyxy"][-1], seen["r"][0]
    converted = (xyxy2cxcywh(every.copy()) * r).astype(np.float32)
    picked, j = [], 0
    for row in rows[:, 1:]:
        while j < len(converted) and not np.array_equal(converted[j], row):
            j += 1
        assert j < len(converted), "a row of TrainTransform's output matches none of its boxes"
        picked.append(j)
        j += 1
    return every[picked] * r


@needs_module("yolox", "YOLOX's TrainTransform against yolox")
class TrainTransformTest(Exact):
    def check(self, what, img, boxes, labels, d, size, max_labels=120, hsv_prob=1.0, flip_prob=0.5):
        params = {k: d[k] for k in ("hsv", "gains", "flip")}
        mine, mb, ml, _ = ours("yolox_train_transform", img, boxes, labels,
                               {**params, "input": [size, size], "max_labels": [max_labels]})
        with train_recorder() as seen, replayed(d["draws"]):
            out, padded = DA.TrainTransform(max_labels=max_labels, flip_prob=flip_prob, hsv_prob=hsv_prob)(
                bgr(img), targets(boxes, labels), (size, size))
        rows = padded[np.any(padded != 0, axis=1)]
        self.assert_pixels(what, mine, bgr(out.transpose(1, 2, 0).astype(np.uint8)))
        self.assertEqual(ml, [int(v) for v in rows[:, 0]], f"{what}: the boxes kept (their classes)")
        if len(boxes):
            self.assert_boxes(what, mb, expected_xyxy(seen, rows))
        err = float(np.abs(xyxy2cxcywh(mb.astype(np.float64).copy()) - rows[:, 1:]).max(initial=0))
        self.assertLessEqual(err, CXCYWH_ATOL, f"{what}: cxcywh differs by {err}")
        return err

    def test_given_draws(self):
        rng = np.random.default_rng(31)
        worst = 0.0
        for seed in range(16):
            size = (640, 416, 320, 256)[seed % 4]
            h, w = (int(v) for v in rng.integers(40, 900, 2))
            img = random_image(rng, h, w)
            boxes = random_boxes(rng, 10, w, h, min_side=0.2)  # some too small once scaled
            labels = rng.integers(0, 80, len(boxes))
            hsv_prob = (1.0, 0.5)[seed % 2]
            d = draw("yolox_train_transform", seed, img, boxes, labels, {"hsv_prob": [hsv_prob], "flip_prob": [0.5]})
            worst = max(worst, self.check(f"TrainTransform seed {seed} ({w}x{h} to {size}, hsv {d['hsv']}, flip "
                                          f"{d['flip']})", img, boxes, labels, d, size, hsv_prob=hsv_prob))
        print(f"  TrainTransform: cxcywh within {worst:.3g} of crucible's xyxy converted")

    def test_edges(self):
        rng = np.random.default_rng(32)
        img = random_image(rng, 300, 500)
        tiny = random_boxes(rng, 5, 500, 300, min_side=0.1) * np.float32([1, 1, 1, 1])
        tiny[:, 2:] = tiny[:, :2] + 0.5  # none survives: the sample as it came, every box
        many = random_boxes(rng, 130, 500, 300, min_side=3)  # more than max_labels
        for name, boxes in (("no box survives", tiny), ("130 boxes, 120 kept", many)):
            labels = rng.integers(0, 80, len(boxes))
            d = draw("yolox_train_transform", 7, img, boxes, labels, {"hsv_prob": [1.0], "flip_prob": [0.5]})
            self.check(f"TrainTransform: {name}", img, boxes, labels, d, 320)
        d = draw("yolox_train_transform", 7, img, [], [], {"hsv_prob": [1.0], "flip_prob": [0.5]})
        self.assertEqual(d["draws"], [], "no draw for a sample without boxes")
        self.check("TrainTransform: no boxes", img, [], [], {"hsv": [0], "gains": [0, 0, 0], "flip": [0], "draws": []},
                   320)


# ---- the preset's whole training transform -----------------------------------------------------------

@needs_module("yolox", "the yolox preset's training transform against MosaicDetection with TrainTransform")
class PipelineTest(Exact):
    def test_mosaic_detection(self):
        """MosaicDetection(COCODataset(...), TrainTransform(max_labels=120, ...)) with yolox_base's
        settings, crucible's draws replayed: mosaic, random_affine, mixup (its redraw of a sample
        without boxes), TrainTransform; and with mosaic off (epoch past data.yolox_mosaic_epochs)."""
        rng = np.random.default_rng(41)
        worst = 0.0
        for size, n_seeds in ((320, 24), (640, 2)):
            images, boxes, labels, crowd, ds = dataset(rng, 6, (size, size))
            settings = {"input": [size], "size": [6], "mosaic_epochs": [2], "mosaic_scale": [0.1, 2.0],
                        "mixup_scale": [0.5, 1.5], "flip_prob": [0.5]}
            for k in range(6):
                settings.update(sample_params(k, images[k], boxes[k], labels[k], crowd[k]))
            for seed in range(n_seeds):
                index, epoch = seed % 4, (0, 0, 1, 2)[seed % 4]  # 0-3: no crowd box in the sample itself
                s = {**settings, "epoch": [epoch]}
                d = draw("yolox_train", seed, images[index], boxes[index], labels[index], s, index=index, epoch=epoch)
                mine, mb, ml, _ = ours("yolox_train", images[index], boxes[index], labels[index], {**s, **d})
                md = MD.MosaicDetection(
                    ds, img_size=(size, size), mosaic=epoch < 2,
                    preproc=DA.TrainTransform(max_labels=120, flip_prob=0.5, hsv_prob=1.0), degrees=10.0, translate=0.1,
                    mosaic_scale=(0.1, 2), mixup_scale=(0.5, 1.5), shear=2.0, enable_mixup=True, mosaic_prob=1.0,
                    mixup_prob=1.0)
                with train_recorder() as seen, replayed(d["draws"]):
                    out, padded, _, _ = md[index]
                what = f"pipeline {size}, sample {index}, epoch {epoch}, seed {seed} ({len(d['draws'])} draws)"
                self.assert_pixels(what, mine, bgr(out.transpose(1, 2, 0).astype(np.uint8)))
                rows = padded[np.any(padded != 0, axis=1)]
                self.assertEqual(ml, [int(v) for v in rows[:, 0]], f"{what}: classes")
                self.assert_boxes(what, mb, expected_xyxy(seen, rows))
                err = float(np.abs(xyxy2cxcywh(mb.astype(np.float64).copy()) - rows[:, 1:]).max(initial=0))
                self.assertLessEqual(err, CXCYWH_ATOL, f"{what}: cxcywh differs by {err}")
                worst = max(worst, err)
        print(f"  pipeline: cxcywh within {worst:.3g} of crucible's xyxy converted")


# ---- the preset through the loader ---------------------------------------------------------------------

# Each data.yolox_* key with a value that changes the preset's batches (PresetTest.test_each_key_arrives).
YOLOX_CHANGES = {"data.yolox_size": 64, "data.yolox_mosaic_epochs": 0, "data.yolox_mosaic_prob": 0.0,
                 "data.yolox_mixup": False, "data.yolox_mixup_prob": 0.0, "data.yolox_hsv_prob": 0.0,
                 "data.yolox_degrees": 0.0, "data.yolox_translate": 0.0, "data.yolox_mosaic_scale": [0.5, 1.5],
                 "data.yolox_mixup_scale": [0.6, 1.2], "data.yolox_shear": 0.0, "data.yolox_max_labels": 1}
YOLOX_KEYS = frozenset(YOLOX_CHANGES)


class PresetTest(unittest.TestCase):
    """data.detection_preset = "yolox" through the Python loader (no oracle): fixed squares, the
    same batches for any thread count, and with every augmentation off (no mosaic epoch, no HSV, no
    flip) training serves what evaluation's letterbox does."""

    @classmethod
    def setUpClass(cls):
        import os
        import subprocess
        import tempfile
        cls.tmp = tempfile.TemporaryDirectory()
        make = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make-detection-set")
        subprocess.run([make, cls.tmp.name, "--train", "12", "--val", "4", "--seed", "3"], check=True,
                       stdout=subprocess.DEVNULL)
        cls.ann = os.path.join(cls.tmp.name, "annotations", "instances_train.json")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def batches(self, train=True, threads=2, epoch=0, **settings):
        import crucible
        # YOLOX batches without aspect-ratio groups (its YoloBatchSampler): every sample once an epoch
        s = {"data.detection_preset": "yolox", "data.yolox_size": 96, "run.seed": 5,
             "data.aspect_ratio_group_factor": -1, **settings}
        out = {}
        with crucible.ImageLoader(self.ann, batch_size=4, train=train, threads=threads, settings=s, epoch=epoch) as loader:
            for images, targets in loader.batches(epoch):
                for image, t in zip(images, targets):
                    crowd = t["iscrowd"].numpy() != 0
                    out[int(t["image_id"])] = (image.numpy().copy(), t["boxes"].numpy()[~crowd].copy(),
                                               t["labels"].numpy()[~crowd].tolist(), int(crowd.sum()))
        return out

    def test_squares_and_threads(self):
        one, three = self.batches(threads=1), self.batches(threads=3)
        self.assertEqual(sorted(one), sorted(three))
        for k, (image, boxes, labels, _) in one.items():
            self.assertEqual(image.shape, (3, 96, 96))
            np.testing.assert_array_equal(image, three[k][0], f"image {k}: another thread count, other pixels")
            np.testing.assert_array_equal(boxes, three[k][1])
            self.assertEqual(labels, three[k][2])
        self.assertNotEqual(sorted((k, v[0].tobytes()) for k, v in one.items()),
                            sorted((k, v[0].tobytes()) for k, v in self.batches(epoch=1).items()),
                            "epoch 1 draws the same augmentation as epoch 0")

    def test_each_key_arrives(self):
        """Each data.yolox_* key changes what the loader gives (test_detection_data.py's
        EveryDetectionKeyArrives walks the other detection keys; YOLOX_KEYS are walked here)."""
        base = self.batches()

        def digest(batches):
            return sorted((k, v[0].tobytes(), v[1].tobytes()) for k, v in batches.items())
        walked = set()
        for key, value in YOLOX_CHANGES.items():
            walked.add(key)
            changed = self.batches(**{key: value})
            if key == "data.yolox_size":
                self.assertEqual({v[0].shape for v in changed.values()}, {(3, 64, 64)}, key)
            elif key == "data.yolox_max_labels":
                self.assertGreater(max(len(v[1]) for v in base.values()), 1, "no image with two boxes to cut")
                self.assertEqual(max(len(v[1]) for v in changed.values()), 1, key)
            else:
                self.assertNotEqual(digest(changed), digest(base), f"{key} = {value} changes nothing")
        import crucible
        declared = {k for k, _ in crucible._native.data_keys() if k.startswith("data.yolox_")}
        self.assertEqual(declared, set(YOLOX_KEYS))
        self.assertEqual(walked, set(YOLOX_KEYS))

    def test_no_augmentation_is_the_letterbox(self):
        plain = self.batches(epoch=3, **{"data.yolox_mosaic_epochs": 3, "data.yolox_hsv_prob": 0.0, "data.hflip": 0.0})
        letterboxed = self.batches(train=False)
        self.assertEqual(sorted(plain), sorted(letterboxed))
        crowds = 0
        for k, (image, boxes, labels, crowd) in plain.items():
            np.testing.assert_array_equal(image, letterboxed[k][0], f"image {k}")
            # training drops crowd boxes (YOLOX loads annotations with iscrowd=False), evaluation keeps them
            self.assertEqual(crowd, 0, f"image {k}: a crowd box in training")
            crowds += letterboxed[k][3]
            np.testing.assert_array_equal(boxes, letterboxed[k][1], f"image {k}'s boxes")  # none of 1 pixel or less
            self.assertEqual(labels, letterboxed[k][2])
            self.assertIn(114, image, f"image {k}: no letterbox fill")
        self.assertGreater(crowds, 0, "the set holds no crowd box: the comparison shows less than it should")


if __name__ == "__main__":
    unittest.main()
