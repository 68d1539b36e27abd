# audit-deps: python .venv-torch2
"""crucible's COCO box evaluation (src/data/eval/coco_eval.cpp, issue 48) against pycocotools'
COCOeval on the same files: the 12 summary numbers to 1e-6 and the whole precision and recall
arrays, on crafted cases (crowd boxes, images without boxes or detections, tied scores, more
than 100 detections on an image, boxes in every area range, a ground truth box with id 0,
categories without boxes) and on random sets."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import numpy as np

from crucible import _native
from oracle import needs_module


def coco_file(path, images, categories, annotations):
    with open(path, "w") as f:
        json.dump({"images": [{"id": i, "width": 640, "height": 480, "file_name": f"{i}.jpg"} for i in images],
                   "categories": [{"id": c, "name": f"c{c}"} for c in categories],
                   "annotations": annotations}, f)


def ann(id, image, cat, box, crowd=0, area=None):
    return {"id": id, "image_id": image, "category_id": cat, "bbox": [float(v) for v in box],
            "area": float(box[2] * box[3] if area is None else area), "iscrowd": crowd}


def det(image, cat, box, score):
    return {"image_id": image, "category_id": cat, "bbox": [float(v) for v in box], "score": float(score)}


def random_set(rng, images=12, categories=(1, 3, 7), max_boxes=12):
    anns, dets, n = [], [], 1
    for i in range(1, images + 1):
        for _ in range(int(rng.integers(0, max_boxes + 1))):
            w, h = (float(v) for v in rng.choice([4, 20, 40, 90, 150], 2) * rng.uniform(0.5, 1.5, 2))
            x, y = (float(v) for v in rng.uniform(0, 400, 2))
            c = int(rng.choice(categories))
            crowd = int(rng.random() < 0.08)
            anns.append(ann(n, i, c, [x, y, w, h], crowd, area=w * h * rng.uniform(0.6, 1.0)))
            n += 1
            for _ in range(int(rng.integers(0, 3))):  # detections near it, some of another category
                jit = rng.normal(0, 0.15, 4) * [w, h, w, h]
                box = [x + jit[0], y + jit[1], max(1.0, w + jit[2]), max(1.0, h + jit[3])]
                dc = c if rng.random() < 0.85 else int(rng.choice(categories))
                dets.append(det(i, dc, box, round(float(rng.random()), 2)))  # rounded: ties
        for _ in range(int(rng.integers(0, 6))):  # false positives
            w, h = (float(v) for v in rng.uniform(3, 120, 2))
            dets.append(det(i, int(rng.choice(categories)), [*rng.uniform(0, 500, 2), w, h], round(float(rng.random()), 2)))
    return anns, dets


@needs_module("pycocotools", "COCO box evaluation against pycocotools' COCOeval")
class CocoEvalAgainstPycocotools(unittest.TestCase):
    def compare(self, what, images, categories, anns, dets):
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
        with tempfile.TemporaryDirectory() as d:
            gt_path, res_path = os.path.join(d, "gt.json"), os.path.join(d, "res.json")
            coco_file(gt_path, images, categories, anns)
            with open(res_path, "w") as f:
                json.dump(dets, f)
            ours = _native.coco_eval(gt_path, res_path)
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                gt = COCO(gt_path)
                e = COCOeval(gt, gt.loadRes(res_path), "bbox")
                e.evaluate()
                e.accumulate()
                e.summarize()
        np.testing.assert_allclose(ours["stats"], e.stats, rtol=0, atol=1e-6, err_msg=f"{what}: the 12 numbers")
        np.testing.assert_allclose(np.array(ours["precision"]).reshape(e.eval["precision"].shape), e.eval["precision"],
                                   rtol=0, atol=1e-12, err_msg=f"{what}: precision [T, R, K, A, M]")
        np.testing.assert_allclose(np.array(ours["recall"]).reshape(e.eval["recall"].shape), e.eval["recall"],
                                   rtol=0, atol=1e-12, err_msg=f"{what}: recall [T, K, A, M]")
        self.assertEqual(ours["summary"].strip().splitlines()[-1].split("=")[-1].strip(),
                         printed.getvalue().strip().splitlines()[-1].split("=")[-1].strip(), what)
        return ours["stats"]

    def test_crafted_cases(self):
        boxes = [[10, 10, 20, 20], [50, 50, 40, 40], [100, 100, 120, 100]]  # small, medium, large
        anns = [ann(k + 1, 1, 1, b) for k, b in enumerate(boxes)]
        anns += [ann(10, 2, 1, [0, 0, 200, 200], crowd=1),        # a crowd region holding detections
                 ann(11, 2, 1, [300, 300, 50, 50]),
                 ann(0, 4, 3, [5, 5, 30, 30]),                     # id 0: pycocotools never counts it matched
                 ann(12, 4, 3, [60, 5, 30, 30])]
        dets = [det(1, 1, [11, 11, 20, 20], 0.9), det(1, 1, [52, 48, 40, 41], 0.9),   # a tie
                det(1, 1, [100, 100, 100, 100], 0.5), det(1, 1, [10, 10, 20, 20], 0.3),  # a duplicate
                det(2, 1, [10, 10, 30, 30], 0.8), det(2, 1, [50, 60, 30, 30], 0.7),      # inside the crowd
                det(2, 1, [300, 300, 50, 50], 0.6),
                det(3, 1, [0, 0, 10, 10], 0.4),                   # an image without boxes
                det(4, 3, [5, 5, 30, 30], 0.95), det(4, 3, [60, 5, 30, 30], 0.2)]
        # More than 100 detections on one image, with ties across the cut.
        dets += [det(5, 1, [i % 50 * 8, i // 50 * 8, 10, 10], 0.5 if i % 3 else 0.25) for i in range(130)]
        anns += [ann(100 + i, 5, 1, [i * 8, 0, 10, 10]) for i in range(40)]
        # A detection on a real box (IoU 0.6) and, better, on a crowd region (IoU 1): the real
        # match stands (COCOeval stops at the first ignored box once it holds a real one).
        anns += [ann(200, 6, 7, [0, 0, 100, 100]), ann(201, 6, 7, [0, 0, 60, 100], crowd=1)]
        dets += [det(6, 7, [0, 0, 60, 100], 0.7)]
        stats = self.compare("crafted", [1, 2, 3, 4, 5, 6], [1, 3, 7], anns, dets)
        self.assertTrue(all(-1 <= s <= 1 for s in stats))

    def test_nothing_to_measure_is_minus_one(self):
        # No boxes at all: every number is -1, as COCOeval prints it.
        stats = self.compare("no ground truth", [1, 2], [1], [], [det(1, 1, [0, 0, 5, 5], 0.5)])
        self.assertEqual(list(stats), [-1.0] * 12)
        # Only a false positive (pycocotools' loadRes takes no empty list): precision and recall 0
        # where there are boxes, -1 in the area ranges without any.
        stats = self.compare("a false positive alone", [1], [1], [ann(1, 1, 1, [0, 0, 50, 50])],
                             [det(1, 1, [300, 300, 50, 50], 0.5)])
        self.assertEqual(stats[4], 0.0)
        self.assertEqual(stats[3], -1.0)

    def test_random_sets(self):
        rng = np.random.default_rng(48)
        for seed in range(6):
            anns, dets = random_set(rng, images=10 + 4 * seed)
            self.compare(f"random set {seed}", list(range(1, 11 + 4 * seed)), [1, 3, 7], anns, dets)

    def test_refusals_name_the_detection(self):
        with tempfile.TemporaryDirectory() as d:
            gt_path = os.path.join(d, "gt.json")
            coco_file(gt_path, [1], [1, 3], [ann(1, 1, 1, [0, 0, 5, 5])])
            with self.assertRaisesRegex(ValueError, "detection 0: category 2 is not in the ground truth"):
                _native.coco_eval(gt_path, [[1, 2, 0, 0, 5, 5, 0.5]])
            with self.assertRaisesRegex(ValueError, "detection 0: image 9 is not in the ground truth"):
                _native.coco_eval(gt_path, [[9, 1, 0, 0, 5, 5, 0.5]])


if __name__ == "__main__":
    unittest.main()
