// torchvision.ops' box functions (nn/box_ops.h) against torchvision itself, in the oracle Python
// (Debian's torchvision 0.14 with libtorch 1.13 here, the venv's with torch 2.x in make
// test-torch2): box_iou and generalized_box_iou bit for bit on random boxes (degenerate and
// disjoint ones among them), nms and batched_nms's kept indices in order, with tied scores, on
// both of batched_nms's paths (one nms over moved boxes up to 4000 coordinates, one per category
// above), in float32 and float64.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>

#include "crucible/core/compat.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/box_ops.h"
#include "test_util.h"

namespace crucible::nn {
namespace {

// Writes boxes, scores and categories for each case, and torchvision's answers, as .npy files.
std::string oracle(const std::string& dir) {
  return "D = '" + dir + "/'\n" + R"(import numpy as np, torch, torchvision
from torchvision.ops import box_iou, generalized_box_iou, nms, batched_nms
g = torch.Generator().manual_seed(48)
def boxes(n, dtype):
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 300
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 80
    wh[::7] = 0                                 # degenerate: no area
    b = torch.cat([xy, xy + wh], 1).to(dtype)
    return b
def save(name, t): np.save(D + name + '.npy', t.numpy())
for dtype, tag in ((torch.float32, 'f32'), (torch.float64, 'f64')):
    a, b = boxes(37, dtype), boxes(23, dtype)
    save('a_' + tag, a); save('b_' + tag, b)
    save('iou_' + tag, box_iou(a, b)); save('giou_' + tag, generalized_box_iou(a, b))
    for n, name in ((300, 'small'), (1500, 'large')):   # 1200 and 6000 coordinates: both paths
        bx = boxes(n, dtype)
        # clusters of overlapping boxes, scores with ties
        bx[n // 2:] = bx[:n - n // 2] + torch.rand(n - n // 2, 4, generator=g, dtype=torch.float64).to(dtype) * 6
        sc = (torch.rand(n, generator=g, dtype=torch.float64) * 20).round().to(dtype) / 20
        ids = torch.randint(0, 5, (n,), generator=g)
        save('boxes_%s_%s' % (name, tag), bx); save('scores_%s_%s' % (name, tag), sc); save('ids_%s_%s' % (name, tag), ids)
        for thr in (0.3, 0.5, 0.7):
            save('nms_%s_%s_%g' % (name, tag, thr), nms(bx, sc, thr))
            save('bnms_%s_%s_%g' % (name, tag, thr), batched_nms(bx, sc, ids, thr))
print('ok')
)";
}

// Equal bit for bit, NaN where torchvision has NaN (two degenerate boxes: 0 / 0).
bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(at::isnan(a), at::isnan(b)) && at::equal(a.nan_to_num(-7), b.nan_to_num(-7));
}

TEST(BoxOps, EqualTorchvisionOpsBitForBit) {
  test::TempDir d;
  ASSERT_EQ(test::run_python(oracle(d.path())).find("ok"), 0u);
  auto load = [&](const std::string& name) { return io::load_npy_tensor(d / (name + ".npy")); };
  int compared = 0;
  for (const std::string tag : {"f32", "f64"}) {
    const at::Tensor a = load("a_" + tag), b = load("b_" + tag);
    EXPECT_TRUE(same(box_iou(a, b), load("iou_" + tag))) << tag;
    EXPECT_TRUE(same(generalized_box_iou(a, b), load("giou_" + tag))) << tag;
    EXPECT_GT(at::isnan(load("iou_" + tag)).sum().item<int64_t>(), 0) << "degenerate pairs expected";
    for (const std::string size : {"small", "large"}) {
      const at::Tensor bx = load("boxes_" + size + "_" + tag), sc = load("scores_" + size + "_" + tag);
      const at::Tensor ids = load("ids_" + size + "_" + tag);
      for (const std::string thr : {"0.3", "0.5", "0.7"}) {
        const double t = std::stod(thr);
        const at::Tensor want = load("nms_" + size + "_" + tag + "_" + thr);
        const at::Tensor got = nms(bx, sc, t);
        EXPECT_TRUE(at::equal(got, want)) << "nms " << size << " " << tag << " " << thr << ": " << got.size(0)
                                          << " kept, torchvision " << want.size(0);
        // The GPU's path (the IoU mask), run here on the CPU.
        const at::Tensor by_mask = nms_by_mask(bx, sc, t);
        EXPECT_TRUE(at::equal(by_mask, want)) << "nms_by_mask " << size << " " << tag << " " << thr << ": "
                                              << by_mask.size(0) << " kept, torchvision " << want.size(0);
        const at::Tensor bwant = load("bnms_" + size + "_" + tag + "_" + thr);
        const at::Tensor bgot = batched_nms(bx, sc, ids, t);
        EXPECT_TRUE(at::equal(bgot, bwant)) << "batched_nms " << size << " " << tag << " " << thr << ": "
                                            << bgot.size(0) << " kept, torchvision " << bwant.size(0);
        EXPECT_GT(want.size(0), 0);
        EXPECT_LT(want.size(0), bx.size(0));  // something suppressed
        compared += 2;
      }
    }
  }
  EXPECT_EQ(compared, 24);
}

// An IoU on the threshold's float32 neighbour: torchvision's kernels compare a float32 IoU with
// the double threshold, so a box whose IoU is float(0.6) (above 0.6) is suppressed at 0.6 by both
// paths, and one whose IoU is 0.5 exactly is kept at 0.5.
TEST(BoxOps, NmsComparesTheIouWithTheThresholdInDouble) {
  // IoU = inter / union with a 10 × 10 box: a second box [0, 0, 10, h] has IoU h / 10.
  const auto pair = [](float h) { return at::tensor(std::vector<float>{0, 0, 10, 10, 0, 0, 10, h}, at::kFloat).view({2, 4}); };
  const at::Tensor scores = at::tensor(std::vector<float>{0.9f, 0.8f}, at::kFloat);
  for (float h : {6.0f, 5.0f, 7.0f}) {
    const at::Tensor iou = box_iou(pair(h).narrow(0, 0, 1), pair(h).narrow(0, 1, 1));
    for (double t : {0.5, 0.6, 0.7}) {
      const int64_t want = static_cast<double>(iou.item<float>()) > t ? 1 : 2;  // the loop's comparison
      EXPECT_EQ(nms(pair(h), scores, t).size(0), want) << "h " << h << " threshold " << t;
      EXPECT_EQ(nms_by_mask(pair(h), scores, t).size(0), want) << "h " << h << " threshold " << t;
    }
  }
  // float(0.6) is above 0.6: h = 6 suppresses at threshold 0.6.
  EXPECT_EQ(box_iou(pair(6).narrow(0, 0, 1), pair(6).narrow(0, 1, 1)).item<float>(), 0.6f);
  EXPECT_EQ(nms_by_mask(pair(6), scores, 0.6).size(0), 1);
}

// The CUDA build's GPU path (nms_by_mask on the device) keeps what the CPU kernel keeps, on
// clusters with tied scores, for nms and batched_nms.
TEST(BoxOps, NmsOnTheGpuKeepsWhatTheCpuKeeps_CUDA) {
  if (compat::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(48);
  for (const int64_t n : {1, 300, 3000}) {
    at::Tensor xy = at::rand({n, 2}, at::kFloat) * 300, wh = at::rand({n, 2}, at::kFloat) * 80;
    at::Tensor boxes = at::cat({xy, xy + wh}, 1);
    boxes.narrow(0, n / 2, n - n / 2).copy_(boxes.narrow(0, 0, n - n / 2) + at::rand({n - n / 2, 4}) * 6);
    const at::Tensor scores = (at::rand({n}, at::kFloat) * 20).round() / 20;
    const at::Tensor ids = at::randint(0, 5, {n}, at::kLong);
    for (double t : {0.3, 0.5, 0.6}) {
      const at::Tensor cpu = nms(boxes, scores, t);
      const at::Tensor gpu = nms(boxes.cuda(), scores.cuda(), t);
      EXPECT_TRUE(gpu.is_cuda());
      EXPECT_TRUE(at::equal(gpu.cpu(), cpu)) << n << " boxes, threshold " << t;
      EXPECT_TRUE(at::equal(batched_nms(boxes.cuda(), scores.cuda(), ids.cuda(), t).cpu(), batched_nms(boxes, scores, ids, t)))
          << n << " boxes, threshold " << t;
    }
  }
}

TEST(BoxOps, EmptyInputsAndBadShapes) {
  const at::Tensor none = at::zeros({0, 4}), scores = at::zeros({0});
  EXPECT_EQ(nms(none, scores, 0.5).numel(), 0);
  EXPECT_EQ(batched_nms(none, scores, at::zeros({0}, at::kLong), 0.5).numel(), 0);
  EXPECT_EQ(box_iou(none, at::rand({3, 4})).sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_THROW(box_iou(at::rand({3, 5}), at::rand({3, 4})), std::exception);
  EXPECT_THROW(nms(at::rand({3, 4}), at::rand({2}), 0.5), std::exception);
}

}  // namespace
}  // namespace crucible::nn
