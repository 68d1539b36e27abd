// torchvision.ops' box functions (nn/box_ops.h) against torchvision itself, in the oracle Python
// (Debian's torchvision 0.14 with libtorch 1.13 here, the venv's with torch 2.x in make
// test-torch2): box_iou and generalized_box_iou bit for bit on random boxes (degenerate and
// disjoint ones among them), nms and batched_nms's kept indices in order, with tied scores, on
// both of batched_nms's paths (one nms over moved boxes up to 4000 coordinates, one per category
// above), in float32 and float64.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>

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
