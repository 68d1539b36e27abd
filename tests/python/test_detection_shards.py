# audit-deps: python .venv-torch2
"""Detection sets as shards (issue 47): WebDataset shards whose .json targets are torchvision's own
targets (CocoDetection wrapped for transforms.v2, written with tarfile as a PyTorch user exports
them) read image by image as torchvision reads the COCO file; `crucible pack` of the COCO file
reads back as the file, image by image; a re-encoded pack's boxes are v2's Resize of the file's
boxes to the stored size. The sets are made by scripts/make-detection-set."""
import io
import json
import os
import subprocess
import tarfile
import tempfile
import unittest

import numpy as np
import torch
import torchvision

from oracle import TF2, needs_module, needs_v2
from test_detection_data import crucible_targets, make_set

CRUCIBLE = os.environ.get("CRUCIBLE", os.path.join(os.path.dirname(__file__), "..", "..", "build", "crucible"))


def pack(src, dst, *options):
    r = subprocess.run([CRUCIBLE, "pack", src, dst, *options], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"crucible pack exited {r.returncode}: {r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def assert_same_targets(test, got, want, category_ids=None):
    """Image by image (keyed by image id): the same pixels, boxes (bit for bit), labels and crowd flags."""
    test.assertEqual(sorted(got), sorted(want))
    for image_id, (image, t) in want.items():
        other_image, other = got[image_id]
        test.assertTrue(torch.equal(other_image, image), f"image {image_id}: pixels differ")
        test.assertTrue(torch.equal(other["boxes"], t["boxes"]), f"image {image_id}: {other['boxes']} vs {t['boxes']}")
        test.assertEqual(other["labels"].tolist(), t["labels"].tolist(), f"image {image_id}")
        test.assertEqual(other["iscrowd"].tolist(), t["iscrowd"].tolist(), f"image {image_id}")


@needs_module("pycocotools", "WebDataset shards of CocoDetection's targets")
@needs_v2("WebDataset shards of CocoDetection's targets, wrapped for transforms.v2")
class WebDatasetShardsOfTorchvisionTargets(unittest.TestCase):
    def test_shards_of_coco_detection_targets_read_as_coco_detection(self):
        with tempfile.TemporaryDirectory() as d:
            make_set(d, train=24, val=4, seed=5)
            root, ann = os.path.join(d, "train"), os.path.join(d, "annotations", "instances_train.json")
            base = torchvision.datasets.CocoDetection(root, ann)
            ref = torchvision.datasets.wrap_dataset_for_transforms_v2(
                base, target_keys={"image_id", "boxes", "labels", "iscrowd"})
            categories = sorted(base.coco.cats)  # the shards' labels are class indices, in id order
            # Two shards; half the targets state the image's size, the other half leave it to the JPEG's header.
            want = {}
            for k in range(2):
                with tarfile.open(os.path.join(d, f"det-{k}.tar"), "w") as t:
                    for i in range(k * len(ref) // 2, (k + 1) * len(ref) // 2):
                        image, target = ref[i]
                        info = base.coco.imgs[base.ids[i]]
                        boxes = target["boxes"].as_subclass(torch.Tensor) if "boxes" in target else torch.zeros(0, 4)
                        obj = {"image_id": target["image_id"], "boxes": boxes.tolist(),
                               "labels": [categories.index(c) for c in target.get("labels", torch.zeros(0)).tolist()],
                               "iscrowd": [int(c) for c in target.get("iscrowd", [])]}
                        if i % 2 == 0:
                            obj.update(width=info["width"], height=info["height"])
                        with open(os.path.join(root, info["file_name"]), "rb") as f:
                            members = [("jpg", f.read()), ("json", json.dumps(obj).encode())]
                        for ext, data in members:
                            ti = tarfile.TarInfo(f"{target['image_id']:08d}.{ext}")
                            ti.size = len(data)
                            t.addfile(ti, io.BytesIO(data))
                        # What crucible must give: the pixels PIL decodes, the boxes clipped to the
                        # image as v2's ClampBoundingBoxes clips them (data.bad_boxes = "clamp").
                        clamped = (TF2.clamp_bounding_boxes(target["boxes"]).as_subclass(torch.Tensor)
                                   if "boxes" in target else torch.zeros(0, 4))
                        want[target["image_id"]] = (
                            torch.from_numpy(np.array(image)).permute(2, 0, 1),
                            {"boxes": clamped, "labels": torch.tensor(obj["labels"], dtype=torch.int64),
                             "iscrowd": torch.tensor(obj["iscrowd"], dtype=torch.int64)})
            got, category_ids = crucible_targets(os.path.join(d, "det-{0..1}.tar"))
            self.assertEqual(category_ids, [])  # a shard's labels are its class indices
            assert_same_targets(self, got, want)
            self.assertGreater(sum(len(t["boxes"]) == 0 for _, t in want.values()), 0, "background images")


class PackOfACocoFile(unittest.TestCase):
    def test_a_pack_reads_as_its_coco_file(self):
        with tempfile.TemporaryDirectory() as d:
            make_set(d, train=20, val=4, seed=6)
            ann = os.path.join(d, "annotations", "instances_train.json")
            log = pack(ann, os.path.join(d, "packed"), "--shard-mb", "0.1", "--validate")
            self.assertIn("20 samples", log)
            want, want_ids = crucible_targets(ann)
            got, got_ids = crucible_targets(os.path.join(d, "packed"))
            self.assertEqual(got_ids, want_ids)  # COCO's category ids travel with the pack
            self.assertEqual(want_ids, [1, 3, 7])
            assert_same_targets(self, got, want)
            self.assertGreater(len([n for n in os.listdir(os.path.join(d, "packed")) if n.startswith("shard-")]), 1)

    @needs_v2("a re-encoded pack's boxes against v2's Resize")
    def test_a_reencoded_pack_scales_the_boxes_as_v2_resize(self):
        from torchvision import tv_tensors
        with tempfile.TemporaryDirectory() as d:
            make_set(d, train=16, val=4, seed=8)
            ann = os.path.join(d, "annotations", "instances_train.json")
            pack(ann, os.path.join(d, "small"), "--reencode", "--max-side", "48")
            full, _ = crucible_targets(ann)
            small, _ = crucible_targets(os.path.join(d, "small"))
            self.assertEqual(sorted(small), sorted(full))
            resized = 0
            for image_id, (image, t) in full.items():
                small_image, s = small[image_id]
                h, w = image.shape[1:]
                sh, sw = small_image.shape[1:]
                self.assertEqual(max(sh, sw), min(48, max(h, w)), f"image {image_id}")
                boxes = tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(h, w))
                want = TF2.resize(boxes, size=[sh, sw]).as_subclass(torch.Tensor)
                self.assertTrue(torch.equal(s["boxes"], want), f"image {image_id}: {s['boxes']} vs {want}")
                self.assertEqual(s["labels"].tolist(), t["labels"].tolist())
                resized += (sh, sw) != (h, w) and len(t["boxes"]) > 0
            self.assertGreater(resized, 0)


if __name__ == "__main__":
    unittest.main()
