# audit-deps: python .venv-torch2
"""Detection data against its oracles (issue 47): crucible's COCO reading equals torchvision's
CocoDetection wrapped for transforms.v2 (pycocotools underneath) image by image — ids, boxes,
categories, crowd flags, pixels; the YOLO reading of the same set agrees with it; the flip,
resize, clamp and sanitize operations equal transforms.v2's given the same draws, and the flip's
draw has v2's law; and the Python loader's batches go into a torchvision detection model as they
are. The sets are made by scripts/make-detection-set (JPEGs of shapes with known boxes)."""
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch
import torchvision

import crucible
from crucible import _native
from oracle import TF2, needs_module, needs_v2
from test_distributions import chi2_2samp

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_SET = os.path.join(HERE, "..", "..", "scripts", "make-detection-set")
P_MIN = 1e-6


def make_set(root, train=24, val=8, seed=3):
    subprocess.run([MAKE_SET, root, "--train", str(train), "--val", str(val), "--seed", str(seed)], check=True)
    return root


def crucible_targets(path, **settings):
    """{image_id: (image uint8 [C, H, W], target)} through crucible's loader, in evaluation order."""
    out = {}
    s = {"data.jpeg_decode": "accurate", **settings}
    with crucible.ImageLoader(path, batch_size=5, train=False, threads=2, settings=s) as loader:
        for images, targets in loader:
            for image, t in zip(images, targets):
                out[t["image_id"]] = (image.clone(), t)
        ids = loader.category_ids
    return out, ids


@needs_module("pycocotools", "COCO reading against torchvision's CocoDetection")
@needs_v2("COCO reading against CocoDetection wrapped for transforms.v2")
class CocoAgainstTorchvision(unittest.TestCase):
    def test_every_image_box_category_and_pixel_equals_coco_detection(self):
        with tempfile.TemporaryDirectory() as d:
            make_set(d)
            ann = os.path.join(d, "annotations", "instances_train.json")
            ours, category_ids = crucible_targets(ann)
            base = torchvision.datasets.CocoDetection(os.path.join(d, "train"), ann)
            ref = torchvision.datasets.wrap_dataset_for_transforms_v2(
                base, target_keys={"image_id", "boxes", "labels", "iscrowd"})
            self.assertEqual(len(ours), len(ref))
            self.assertEqual(sorted(ours), list(base.ids))  # CocoDetection's order: sorted ids
            background = clamped = 0
            for i in range(len(ref)):
                image, target = ref[i]
                ours_image, t = ours[target["image_id"]]
                pixels = torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
                self.assertTrue(torch.equal(ours_image, pixels), f"image {target['image_id']}: pixels differ")
                if "boxes" not in target:  # the v2 wrapper gives an image without annotations its id alone
                    self.assertEqual(len(t["boxes"]), 0, f"image {target['image_id']}")
                    background += 1
                    continue
                # data.bad_boxes = "clamp" (the default): a box reaching past its image is clipped to
                # it as v2's ClampBoundingBoxes clips (the set's boxes overhang by up to 2 pixels).
                want = TF2.clamp_bounding_boxes(target["boxes"]).as_subclass(torch.Tensor)
                clamped += int((want != target["boxes"].as_subclass(torch.Tensor)).any(1).sum())
                self.assertTrue(torch.equal(t["boxes"], want), f"image {target['image_id']}: {t['boxes']} vs {want}")
                # crucible's labels are contiguous; category_ids maps them back to COCO's ids.
                self.assertEqual([category_ids[l] for l in t["labels"].tolist()], target["labels"].tolist())
                self.assertEqual(t["iscrowd"].tolist(), list(target["iscrowd"]))
            self.assertGreater(background, 0, "the set should hold background images (no annotation)")
            self.assertGreater(clamped, 0, "the set should hold boxes that overhang their image")
            self.assertEqual(category_ids, [1, 3, 7])


class YoloAgainstCoco(unittest.TestCase):
    def test_the_same_set_in_yolo_labels_reads_as_its_coco_file(self):
        with tempfile.TemporaryDirectory() as d:
            make_set(d, train=16, val=4)
            coco, _ = crucible_targets(os.path.join(d, "annotations", "instances_train.json"))
            yolo, _ = crucible_targets(os.path.join(d, "yolo", "images", "train"))
            # YOLO numbers the images by path order, COCO by id: both are the file order here.
            by_name = sorted(coco.items())
            self.assertEqual(len(yolo), len(by_name))
            for k, (image_id, (image, t)) in enumerate(by_name):
                y_image, y = yolo[k]
                self.assertTrue(torch.equal(image, y_image))
                keep = t["iscrowd"] == 0  # YOLO has no crowd boxes
                # 6 decimals of a normalised coordinate: within 1e-6 × the image's side.
                side = max(image.shape[1:])
                torch.testing.assert_close(y["boxes"], t["boxes"][keep], atol=side * 1e-6 + 1e-4, rtol=0)
                self.assertEqual(y["labels"].tolist(), t["labels"][keep].tolist())


def random_sample(rng, n_boxes):
    h, w = int(rng.integers(8, 60)), int(rng.integers(8, 60))
    image = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
    x1 = rng.uniform(-5, w, n_boxes)
    y1 = rng.uniform(-5, h, n_boxes)
    boxes = np.stack([x1, y1, x1 + rng.uniform(0, w, n_boxes), y1 + rng.uniform(0, h, n_boxes)], 1).astype(np.float32)
    return image, boxes.tolist(), list(range(n_boxes))


def v2_pair(image, boxes):
    from torchvision import tv_tensors
    h, w = image.shape[1:]
    return (tv_tensors.Image(torch.from_numpy(image)),
            tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY",
                                     canvas_size=(h, w)))


@needs_v2("the detection operations against transforms.v2's")
class OperationsAgainstV2(unittest.TestCase):
    def check(self, op, params, v2_image, v2_boxes, seed=0):
        rng = np.random.default_rng(seed)
        for trial in range(60):
            image, boxes, labels = random_sample(rng, int(rng.integers(0, 6)))
            got_image, got_boxes, got_labels, _ = _native.detection_op(image, boxes, labels, op, params)
            ti, tb = v2_pair(image, boxes)
            want_image, want_boxes, keep = v2_image(ti), v2_boxes(tb), None
            if isinstance(want_boxes, tuple):
                want_boxes, keep = want_boxes
            self.assertTrue(np.array_equal(got_image, want_image.numpy()), f"{op} trial {trial}: pixels")
            want = want_boxes.as_subclass(torch.Tensor).reshape(-1, 4)
            self.assertTrue(torch.equal(torch.tensor(got_boxes, dtype=torch.float32).reshape(-1, 4), want),
                            f"{op} trial {trial}: {got_boxes} vs {want.tolist()}")
            if keep is not None:
                self.assertEqual(got_labels, [l for l, k in zip(labels, keep.tolist()) if k])

    def test_horizontal_flip(self):
        self.check("horizontal_flip", {"flip": [1]}, TF2.horizontal_flip, TF2.horizontal_flip)

    def test_resize(self):
        for size in ([17, 23], [64, 9], [8, 8]):
            self.check("resize", {"size": size}, lambda x: TF2.resize(x, size), lambda b: TF2.resize(b, size))

    def test_clamp(self):
        self.check("clamp_bounding_boxes", {}, lambda x: x, TF2.clamp_bounding_boxes)

    def test_sanitize(self):
        from torchvision.transforms import v2

        def sanitize(b):
            out = v2.SanitizeBoundingBoxes(min_size=2.5, min_area=6, labels_getter=None)(b)
            mask = torch.tensor([any(torch.equal(r, o) for o in out) for r in b.as_subclass(torch.Tensor)],
                                dtype=torch.bool)
            return out, mask
        self.check("sanitize_bounding_boxes", {"min_size": [2.5], "min_area": [6]}, lambda x: x, sanitize)


@needs_v2("the flip's draw against RandomHorizontalFlip's")
class FlipDrawHasV2sLaw(unittest.TestCase):
    N = 4000

    def crucible_flips(self, p):
        image = np.zeros((3, 4, 4), np.uint8)
        return [_native.detection_draw("horizontal_flip", 11, 0, i, image, [], [], {"p": [p]})["flip"][0]
                for i in range(self.N)]

    def torchvision_flips(self, p):
        from torchvision.transforms import v2
        torch.manual_seed(0)
        t = v2.RandomHorizontalFlip(p)
        x = torch.arange(2).reshape(1, 1, 2)
        return [float(not torch.equal(t(x), x)) for _ in range(self.N)]

    def test_flip_frequency_D14(self):
        for p in (0.5, 0.2):
            pv = chi2_2samp(self.crucible_flips(p), self.torchvision_flips(p))[2]
            self.assertGreater(pv, P_MIN, f"p={p}: crucible's flips follow another law (chi2 p={pv:.2e})")
        # Power: a flip at 0.6 instead of 0.5 is rejected.
        pv = chi2_2samp(self.crucible_flips(0.6), self.torchvision_flips(0.5))[2]
        self.assertLess(pv, P_MIN, f"a wrong flip probability went unnoticed (p={pv:.2e})")


def batch_digest(loader):
    import hashlib
    h = hashlib.sha256()
    for images, targets in loader:
        for image, t in zip(images, targets):
            h.update(image.contiguous().numpy().tobytes())
            h.update(t["boxes"].numpy().tobytes())
            h.update(t["labels"].numpy().tobytes())
    return h.hexdigest()


class EveryDetectionKeyArrives(unittest.TestCase):
    """Each detection key of [data] changes what a detection loader gives (the classification
    walk, test_settings.py, checks that a classification loader names them not applied)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        make_set(cls.tmp.name, train=16, val=4, seed=7)
        cls.ann = os.path.join(cls.tmp.name, "annotations", "instances_train.json")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def loader(self, train=True, **settings):
        return crucible.ImageLoader(self.ann if train else self.ann.replace("_train", "_val"), batch_size=4,
                                    train=train, threads=2, seed=3, settings=settings)

    def boxes(self, **settings):  # the training file's boxes, in order
        loader = crucible.ImageLoader(self.ann, batch_size=4, train=False, threads=2, settings=settings)
        return sum(len(t["boxes"]) for _, targets in loader for t in targets)

    def test_each_key(self):
        walked = set()

        def walk(key):
            walked.add(key)
            return key
        base = batch_digest(self.loader())
        self.assertNotEqual(batch_digest(self.loader(**{walk("data.detection_preset"): "ssdlite"})), base)
        self.assertNotEqual(batch_digest(self.loader(**{walk("data.aspect_ratio_group_factor"): -1})), base)
        zoom = {"data.detection_preset": "ssd"}
        self.assertNotEqual(batch_digest(self.loader(**zoom, **{walk("data.detection_fill"): [0.0, 0.0, 0.0]})),
                            batch_digest(self.loader(**zoom)))
        lsj = {"data.detection_preset": "lsj", walk("data.lsj_size"): 64}
        self.assertEqual({tuple(i.shape[1:]) for images, _ in self.loader(**lsj) for i in images}, {(64, 64)})
        self.assertLess(self.boxes(**{walk("data.bad_boxes"): "drop"}), self.boxes())  # the set's boxes overhang
        with self.assertRaisesRegex(ValueError, "data.bad_boxes"):
            self.loader(**{"data.bad_boxes": "refuse"})
        with self.assertRaisesRegex(ValueError, "data.max_boxes = 2"):
            self.loader(**{walk("data.max_boxes"): 2})
        for key, train in (("data.images_root", True), ("data.test_images_root", False)):
            with self.assertRaisesRegex(ValueError, "/nonexistent-root"):
                list(self.loader(train=train, **{walk(key): "/nonexistent-root"}))
        images, _ = next(iter(self.loader(**{walk("data.size_divisible"): 64})))
        self.assertEqual({s % 64 for s in images[0]._base.shape[-2:]}, {0})
        from test_detection_yolox import YOLOX_KEYS  # test_detection_yolox.PresetTest walks the data.yolox_* keys
        walked |= set(YOLOX_KEYS)
        every = {k for k, _ in _native.data_keys() if k in set(_native.detection_keys())}
        self.assertEqual(every - walked, set(), "detection keys this walk does not show arriving")


class LoaderFeedsATorchvisionDetector(unittest.TestCase):
    def test_batches_go_into_fcos_as_they_are(self):
        from torchvision.models.detection import fcos_resnet50_fpn
        with tempfile.TemporaryDirectory() as d:
            make_set(d, train=4, val=2)
            torch.manual_seed(0)
            model = fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3, min_size=96, max_size=160)
            loader = crucible.ImageLoader(os.path.join(d, "annotations", "instances_train.json"), batch_size=2,
                                          train=True, threads=1, dtype=torch.float32)
            self.assertEqual(loader.classes, ["rectangle", "ellipse", "triangle"])
            images, targets = next(iter(loader))
            self.assertEqual(len(images), 2)
            self.assertEqual(images[0].dim(), 3)
            model.train()
            losses = model(images, targets)
            self.assertEqual(set(losses), {"classification", "bbox_regression", "bbox_ctrness"})
            self.assertTrue(all(torch.isfinite(v) for v in losses.values()), losses)
            model.eval()
            with torch.no_grad():
                out = model(images)
            self.assertEqual(len(out), 2)
            self.assertEqual(set(out[0]), {"boxes", "scores", "labels"})


if __name__ == "__main__":
    unittest.main()
