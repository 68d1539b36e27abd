// `crucible preview`: the PNG holds the training samples as the trainer draws them, un-normalised
// back to their pixels, with their labels:
// - without augmentation every tile is one of the training images, byte for byte, and its label
//   (the PNG's "crucible.labels" chunk) is that image's label — the normalisation round trip is
//   exact and the labels travel with their samples;
// - with CutMix every tile is its own image with a box from the previous one in its batch (the
//   same seed gives the same order), the box's area is (1 − λ) of the tile, and the labels are the
//   two classes with shares λ and 1 − λ;
// - with TrivialAugment the tiles differ from the plain ones; bad usage exits 2.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace crucible {
namespace {

using nlohmann::json;

std::vector<std::string> preview(const test::TempDir& d, const std::string& out, std::initializer_list<std::string> extra) {
  std::vector<std::string> cmd = {test::crucible_binary(), "preview", "--set", "data.train_samples=600",
                                  "--set", "data.hflip=0", "--set", "train.batch_size=12", "--n", "36",
                                  "--out", d / out, "--json"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  return cmd;
}

// Reads the PNGs with PIL and checks them against Debian's Fashion-MNIST (the first 600 samples).
constexpr const char* kCheck = R"PY(
import gzip, json, sys
import numpy as np
from PIL import Image
plain_path, mixed_path, ta_path = sys.argv[1:4]
raw = gzip.open('/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz').read()
images = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)[:600]
labels = np.frombuffer(gzip.open('/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz').read(), np.uint8, offset=8)[:600]
by_bytes = {}
for img, y in zip(images, labels):
    by_bytes.setdefault(img.tobytes(), set()).add(int(y))
def tiles(path):
    im = Image.open(path)
    a = np.asarray(im.convert('RGB'))
    shares = json.loads(im.text['crucible.labels'])
    cols = int(np.ceil(np.sqrt(len(shares))))
    out = []
    for k in range(len(shares)):
        x0, y0 = 2 + (k % cols) * 30, 2 + (k // cols) * (28 + 7 + 2)
        t = a[y0:y0 + 28, x0:x0 + 28]
        assert (t[..., 0] == t[..., 1]).all() and (t[..., 1] == t[..., 2]).all(), 'grey tiles are grey'
        out.append(t[..., 0].copy())
    return out, shares, a.shape
plain, plain_labels, shape = tiles(plain_path)
found = sum(t.tobytes() in by_bytes for t in plain)
right = sum(t.tobytes() in by_bytes and int(list(s)[0]) in by_bytes[t.tobytes()] and list(s.values()) == [1.0]
            for t, s in zip(plain, plain_labels))
print('plain', len(plain), found, right, len(set(t.tobytes() for t in plain)), shape[1], shape[0])
mixed, mixed_labels, _ = tiles(mixed_path)
ok_pixels = ok_box = ok_labels = 0
for k, (m, s) in enumerate(zip(mixed, mixed_labels)):
    j = (k // 12) * 12 + (k % 12 - 1) % 12  # roll(1) within its batch of 12
    own, prev = plain[k], plain[j]
    ok_pixels += bool(((m == own) | (m == prev)).all())
    y_own, y_prev = int(list(plain_labels[k])[0]), int(list(plain_labels[j])[0])
    shares = {int(c): v for c, v in s.items()}
    diff = np.argwhere(m != own)
    box = 0 if len(diff) == 0 else (np.ptp(diff[:, 0]) + 1) * (np.ptp(diff[:, 1]) + 1)
    if y_own == y_prev or len(shares) == 1:  # one class: the whole target on it
        ok_labels += len(shares) == 1 and abs(list(shares.values())[0] - 1) < 1e-6 and (y_own == y_prev or box == 0)
        ok_box += 1
    else:
        ok_labels += set(shares) == {y_own, y_prev} and abs(sum(shares.values()) - 1) < 1e-6
        ok_box += box <= round((1 - shares[y_own]) * 784) + 0.5
print('mixed', len(mixed), ok_pixels, ok_box, ok_labels, sum(len(s) == 2 for s in mixed_labels))
ta, ta_labels, _ = tiles(ta_path)
print('ta', len(ta), sum((a != b).any() for a, b in zip(ta, plain)), sum(sa == sb for sa, sb in zip(ta_labels, plain_labels)))
)PY";

TEST(PreviewCli, TilesAreTheTrainingSamplesWithTheirLabelsCutMixAndAugmentationsIncluded) {
  test::TempDir d;
  auto plain = test::run_command(preview(d, "plain.png", {}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto mixed = test::run_command(preview(d, "mixed.png", {"--set", "data.cutmix_alpha=1.0"}));
  ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
  auto ta = test::run_command(preview(d, "ta.png", {"--set", "data.augment=trivialaugment_wide"}));
  ASSERT_EQ(ta.exit_code, 0) << ta.err;
  const json summary = json::parse(plain.out.substr(plain.out.rfind("\n{") + 1));
  EXPECT_EQ(summary["samples"], 36);
  EXPECT_EQ(summary["batches"], 3);  // 36 samples from batches of 12
  EXPECT_EQ(summary["columns"], 6);
  EXPECT_FALSE(summary["mixed"].get<bool>());
  EXPECT_TRUE(json::parse(mixed.out.substr(mixed.out.rfind("\n{") + 1))["mixed"].get<bool>());

  const std::string out = test::run_python("import sys\nsys.argv = ['check', '" + (d / "plain.png") + "', '" +
                                           (d / "mixed.png") + "', '" + (d / "ta.png") + "']\n" + kCheck);
  std::istringstream in(out);
  std::string tag;
  int n = 0, found = 0, right = 0, distinct = 0, width = 0, height = 0;
  ASSERT_TRUE(in >> tag >> n >> found >> right >> distinct >> width >> height) << out;
  EXPECT_EQ(n, 36);
  EXPECT_EQ(found, 36);     // every tile is a training image, byte for byte
  EXPECT_EQ(right, 36);     // under its own label
  EXPECT_GE(distinct, 35);  // shuffled samples, not one repeated
  EXPECT_EQ(width, summary["width"].get<int>());
  EXPECT_EQ(height, summary["height"].get<int>());
  int ok_pixels = 0, ok_box = 0, ok_labels = 0, two = 0;
  ASSERT_TRUE(in >> tag >> n >> ok_pixels >> ok_box >> ok_labels >> two) << out;
  EXPECT_EQ(ok_pixels, 36);  // each pixel from the tile's own image or the previous one in its batch
  EXPECT_EQ(ok_box, 36);     // the pasted pixels fit in a box of (1 - λ) of the tile
  EXPECT_EQ(ok_labels, 36);  // two classes, shares summing to 1
  EXPECT_GE(two, 24);        // mostly two classes (neighbours of one class, or an empty box, give one)
  int changed = 0, same_labels = 0;
  ASSERT_TRUE(in >> tag >> n >> changed >> same_labels) << out;
  EXPECT_GE(changed, 24);       // TrivialAugment changed most tiles (Identity and no-op draws leave some)
  EXPECT_EQ(same_labels, 36);   // and not their labels

  auto bad = test::run_command({test::crucible_binary(), "preview", "--out", d / "grid.jpg"});
  EXPECT_EQ(bad.exit_code, 2);
  test::expect_contains(bad.err, ".png");
}

// A detection set (scripts/make-detection-set): each tile's boxes in "crucible.boxes" are its
// image's COCO boxes (x + w in float32, clipped to the image: data.bad_boxes = "clamp"), mirrored
// with data.hflip = 1 (x1' = W - x2), under the image's own size; every tile is a training image.
constexpr const char* kCheckBoxes = R"PY(
import json, sys
import numpy as np
from PIL import Image
png, annotations, flipped = sys.argv[1], sys.argv[2], sys.argv[3] == '1'
coco = json.load(open(annotations))
size = {im['id']: (im['width'], im['height']) for im in coco['images']}
by_image = {}
for a in coco['annotations']:
    by_image.setdefault(a['image_id'], []).append(a)
tiles = json.loads(Image.open(png).text['crucible.boxes'])
ok = boxes = 0
for t in tiles:
    w, h = size[t['image_id']]
    want = []
    for a in by_image.get(t['image_id'], []):
        x, y, bw, bh = (np.float32(v) for v in a['bbox'])
        b = [min(max(x, 0), w), min(max(y, 0), h), min(max(x + bw, 0), w), min(max(y + bh, 0), h)]
        if flipped:
            b = [w - b[2], b[1], w - b[0], b[3]]
        want.append([float(np.float32(v)) for v in b])
    ok += (t['width'], t['height']) == (w, h) and t['boxes'] == want
    boxes += len(want)
print(len(tiles), ok, boxes, len(set(t['image_id'] for t in tiles)))
)PY";

TEST(PreviewCli, DetectionTilesCarryTheirImagesCocoBoxesFlippedOrNot) {
  test::TempDir d;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + std::string(CRUCIBLE_TEST_SUPPORT_DIR) + "/../../scripts/make-detection-set " + (d / "set") +
                         " --train 12 --val 4 > /dev/null")
                            .c_str()),
            0);
  const std::string annotations = d / "set/annotations/instances_train.json";
  for (const std::string flip : {"0", "1"}) {
    auto r = test::run_command({test::crucible_binary(), "preview", "--set", "data.dataset=detection", "--set",
                                "data.train_path=" + annotations, "--set",
                                "data.test_path=" + (d / "set/annotations/instances_val.json"), "--set",
                                "data.hflip=" + flip, "--set", "train.batch_size=4", "--n", "10", "--out",
                                d / "boxes.png"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string out = test::run_python("import sys\nsys.argv = ['check', '" + (d / "boxes.png") + "', '" +
                                             annotations + "', '" + flip + "']\n" + kCheckBoxes);
    std::istringstream in(out);
    int tiles = 0, ok = 0, boxes = 0, distinct = 0;
    ASSERT_TRUE(in >> tiles >> ok >> boxes >> distinct) << out;
    EXPECT_EQ(tiles, 10);
    EXPECT_EQ(ok, 10) << "flip " << flip;  // every tile's boxes are its image's
    EXPECT_GT(boxes, 5);                  // and there are boxes to check
    EXPECT_EQ(distinct, 10);              // ten different training images
  }
  // A detection set with the default model (a classifier): refused (exit 2) before the model is
  // built, naming the detectors.
  auto train = test::run_command({test::crucible_binary(), "train", "--set", "data.dataset=detection", "--set",
                                  "data.train_path=" + annotations, "--set",
                                  "data.test_path=" + (d / "set/annotations/instances_val.json"), "--set",
                                  "train.batch_size=4", "--set", "run.dir=" + (d / "runs")});
  EXPECT_EQ(train.exit_code, 2) << train.err;
  test::expect_contains(train.out + train.err, "data.dataset = \"detection\" needs a detector, and model.name = \"fmnist_cnn\"");
  // A detector on class labels (the default Fashion-MNIST job): refused, naming the model.
  auto detector = test::run_command({test::crucible_binary(), "train", "--set", "model.name=fcos_resnet18_fpn", "--set",
                                     "train.max_steps=1", "--set", "run.dir=" + (d / "runs")});
  EXPECT_EQ(detector.exit_code, 2) << detector.err;
  test::expect_contains(detector.err, "fcos_resnet18_fpn");
}

}  // namespace
}  // namespace crucible
