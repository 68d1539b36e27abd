// MixUp/CutMix and random erasing (train/mixup.h) against torchvision's rules:
// - λ from Beta(α, α): a Kolmogorov–Smirnov test of the drawn λ against the Beta CDF (the
//   regularised incomplete beta function, by its continued fraction), for α = 0.2 and 1; with both
//   alphas set, MixUp or CutMix is chosen per batch with probability 1/2 (a binomial bound);
// - the CutMix box and corrected λ are exact against v2.CutMix's make_params given λ and the
//   centre, on a grid;
// - the batch transforms' images and soft targets equal v2.MixUp / v2.CutMix given the same draw;
// - random erasing: each sample's image equals v2.RandomErasing's given the same draws (its
//   apply draw, each try's area share and log ratio, top and left), the erased share follows p,
//   every box keeps torchvision's scale and ratio bounds, and nothing outside it changes;
// The oracle is torchvision.transforms.v2 itself (oracle_python(): the venv's in make
// test-torch2, where a missing v2 fails them); with Debian's torchvision 0.14, which has no v2,
// those comparisons skip (make test counts the skips). tests/python/test_distributions.py checks
// that the draws themselves have torchvision's distributions.
// - every draw is a pure function of (seed, step, rank) — or (seed, epoch, sample) — (law 1,
//   PITFALLS T15).
#include "crucible/train/mixup.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/train/batch_transform.h"
#include "test_util.h"

namespace crucible::train {
namespace {

// I_x(a, b), Numerical Recipes' betacf (modified Lentz), for the KS test's reference CDF.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(b, a, 1 - x);
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m < 500; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1 + aa / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return front * h / a;
}

TEST(MixUp, IncompleteBetaIsTheBetaCdf) {  // the test's own reference, checked where it is known
  EXPECT_NEAR(incomplete_beta(1, 1, 0.3), 0.3, 1e-12);
  EXPECT_NEAR(incomplete_beta(0.5, 0.5, 0.25), 2 / M_PI * std::asin(std::sqrt(0.25)), 1e-10);
  EXPECT_NEAR(incomplete_beta(0.2, 0.2, 0.5), 0.5, 1e-10);
  EXPECT_NEAR(incomplete_beta(2, 3, 0.4), 0.5248, 1e-10);  // 1 - (1-x)^4 - 4x(1-x)^3 ... = 0.5248
}

// KS statistic of a sample of float32-rounded draws against the CDF F of the unrounded variable:
// a float v stands for (v⁻, v⁺), the halfway points to its neighbours, so the rounded variable's
// CDF at v is F(v⁺) and just below v is F(v⁻). (λ is a float32 as torch's Beta sample is; for
// α = 0.2 about 1.5% of Beta's mass lies within 3e-8 of 1 and rounds to 1.0.)
template <class F>
double ks_statistic(std::vector<double> xs, F cdf) {
  std::sort(xs.begin(), xs.end());
  const double n = static_cast<double>(xs.size());
  double d = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto v = static_cast<float>(xs[i]);
    const double up = (static_cast<double>(v) + std::nextafter(v, 2.0f)) / 2;
    const double down = (static_cast<double>(v) + std::nextafter(v, -1.0f)) / 2;
    d = std::max({d, (static_cast<double>(i) + 1) / n - cdf(up), cdf(down) - static_cast<double>(i) / n});
  }
  return d;
}

TEST(MixUp, LambdaFollowsBetaAlphaAlphaKolmogorovSmirnov) {
  const int n = 20000;
  const double critical = 1.95 / std::sqrt(static_cast<double>(n));  // KS at the 0.1% level
  for (double alpha : {0.2, 1.0, 2.5}) {
    std::vector<double> mix, cut;
    for (int step = 0; step < n; ++step) {
      mix.push_back(draw_mix(11, step, 0, alpha, 0, 32, 32).lam);
      cut.push_back(draw_mix(11, step, 0, 0, alpha, 32, 32).lam_drawn);
    }
    auto cdf = [alpha](double x) { return incomplete_beta(alpha, alpha, x); };
    EXPECT_LT(ks_statistic(mix, cdf), critical) << "MixUp, alpha " << alpha;
    EXPECT_LT(ks_statistic(cut, cdf), critical) << "CutMix, alpha " << alpha;
    // The test can fail: Beta(α, 2α) is told apart.
    EXPECT_GT(ks_statistic(mix, [alpha](double x) { return incomplete_beta(alpha, 2 * alpha, x); }), critical);
  }
}

TEST(MixUp, BothAlphasChooseOnePerBatchWithProbabilityOneHalf) {
  const int n = 8000;
  int cutmix = 0;
  for (int step = 0; step < n; ++step) {
    const MixDraw d = draw_mix(3, step, 0, 0.8, 1.0, 24, 16);
    ASSERT_NE(d.kind, MixDraw::Kind::kNone);
    cutmix += d.kind == MixDraw::Kind::kCutMix;
    if (d.kind == MixDraw::Kind::kCutMix) {
      EXPECT_EQ(d.lam, d.box.lam_adjusted);
    }
  }
  EXPECT_LT(std::abs(cutmix - n / 2), 4.5 * std::sqrt(n / 4.0)) << cutmix << " of " << n;
  EXPECT_EQ(draw_mix(3, 5, 0, 0, 0, 24, 16).kind, MixDraw::Kind::kNone);
}

TEST(MixUp, DrawsArePureFunctionsOfSeedStepAndRank) {
  int differs_by_rank = 0, differs_by_seed = 0;
  for (int step = 0; step < 50; ++step) {
    const MixDraw a = draw_mix(7, step, 1, 0.8, 1.0, 24, 16), b = draw_mix(7, step, 1, 0.8, 1.0, 24, 16);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.lam, b.lam);
    EXPECT_EQ(a.box.x1, b.box.x1);
    EXPECT_EQ(a.box.y2, b.box.y2);
    differs_by_rank += draw_mix(7, step, 0, 0.8, 1.0, 24, 16).lam_drawn != a.lam_drawn;
    differs_by_seed += draw_mix(8, step, 1, 0.8, 1.0, 24, 16).lam_drawn != a.lam_drawn;
  }
  EXPECT_GT(differs_by_rank, 45);
  EXPECT_GT(differs_by_seed, 45);
}

// v2.CutMix.make_params given λ and the centre (its Beta sample and torch.randint replaced by the
// given values).
constexpr const char* kCutMixOracle = R"PY(
import math, sys, torch
from torchvision.transforms import v2
cases = [tuple(float(v) for v in line.split()) for line in sys.stdin.read().strip().splitlines()]
for lam, rx, ry, W, H in cases:
    rx, ry, W, H = int(rx), int(ry), int(W), int(H)
    cm = v2.CutMix(num_classes=3)
    class Fixed:
        def sample(self, shape=()): return torch.tensor(lam, dtype=torch.float64)
    cm._dist = Fixed()
    draws = [torch.tensor([rx]), torch.tensor([ry])]
    real = torch.randint
    torch.randint = lambda *a, **k: draws.pop(0)
    try:
        make = getattr(cm, 'make_params', None) or getattr(cm, '_get_params')
        p = make([torch.zeros(2, 1, H, W)])
    finally:
        torch.randint = real
    x1, y1, x2, y2 = p['box']
    print(int(x1), int(y1), int(x2), int(y2), repr(float(p['lam_adjusted'])))
)PY";

#define SKIP_WITHOUT_V2() CRUCIBLE_NEEDS_TRANSFORMS_V2("this test")

std::string run_python_stdin(const std::string& script, const std::string& input) {
  test::TempDir dir;
  test::write_text(dir / "input.txt", input);
  return test::run_python("import sys\nsys.stdin = open('" + (dir / "input.txt") + "')\n" + script);
}

TEST(MixUp, CutMixBoxIsExactGivenLambdaAndCentre) {
  SKIP_WITHOUT_V2();
  struct Case {
    double lam;
    int64_t rx, ry, w, h;
  };
  std::vector<Case> cases;
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{32, 32}, {224, 176}, {7, 13}, {1, 1}};
  for (const auto& [w, h] : sizes) {
    for (double lam : {0.0, 1e-7, 0.013, 0.25, 0.5, 0.61803, 0.9, 0.999, 1.0}) {
      for (int64_t rx : {int64_t{0}, w / 3, w - 1}) {
        for (int64_t ry : {int64_t{0}, h / 2, h - 1}) cases.push_back({lam, rx, ry, w, h});
      }
    }
  }
  std::string input;
  for (const auto& c : cases) input += fmt::format("{} {} {} {} {}\n", c.lam, c.rx, c.ry, c.w, c.h);
  std::istringstream out(run_python_stdin(kCutMixOracle, input));
  int checked = 0;
  for (const auto& c : cases) {
    int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
    double lam_adjusted = 0;
    ASSERT_TRUE(out >> x1 >> y1 >> x2 >> y2 >> lam_adjusted);
    const CutMixBox b = cutmix_box(c.lam, c.rx, c.ry, c.w, c.h);
    const std::string where = fmt::format("lam {} centre ({}, {}) in {}x{}", c.lam, c.rx, c.ry, c.w, c.h);
    EXPECT_EQ(b.x1, x1) << where;
    EXPECT_EQ(b.y1, y1) << where;
    EXPECT_EQ(b.x2, x2) << where;
    EXPECT_EQ(b.y2, y2) << where;
    EXPECT_EQ(b.lam_adjusted, lam_adjusted) << where;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases.size()));
}

// The batch transform against v2.MixUp / v2.CutMix given the same draw. The batch is built the
// same way on both sides (exact integers / 251 in float32).
constexpr const char* kMixOracle = R"PY(
import sys, torch
from torchvision.transforms import v2
for line in sys.stdin.read().strip().splitlines():  # one batch a line
    kind, lam, rx, ry, B, C, H, W, K = line.split()
    lam = float(lam); rx, ry, B, C, H, W, K = (int(v) for v in (rx, ry, B, C, H, W, K))
    x = (torch.arange(B * C * H * W) % 251).to(torch.float32).div(251).reshape(B, C, H, W)
    y = torch.arange(B) % K
    m = v2.MixUp(alpha=1.0, num_classes=K) if kind == 'mixup' else v2.CutMix(alpha=1.0, num_classes=K)
    class Fixed:
        def sample(self, shape=()): return torch.tensor(lam, dtype=torch.float64)
    m._dist = Fixed()
    draws = [torch.tensor([rx]), torch.tensor([ry])]
    real = torch.randint
    torch.randint = lambda *a, **k: draws.pop(0)
    try:
        out, tt = m(x, y)
    finally:
        torch.randint = real
    print(' '.join(repr(v) for v in out.flatten().tolist()))
    print(' '.join(repr(v) for v in tt.flatten().tolist()))
)PY";

TEST(MixUp, BatchTransformEqualsTorchvisionGivenTheDraw) {
  SKIP_WITHOUT_V2();
  const int64_t B = 5, C = 3, H = 6, W = 8, K = 4;
  const at::Tensor input_images =
      at::arange(B * C * H * W, at::kLong).remainder(251).to(at::kFloat).div(251).reshape({B, C, H, W});
  std::vector<DeviceBatch> batches;
  std::string input;
  for (const double mixup : {0.4, 0.0}) {
    const double cutmix = mixup > 0 ? 0.0 : 1.0;
    auto t = mixup_cutmix_transform(21, mixup, cutmix, K);
    for (int64_t step : {0, 1, 2, 3}) {
      DeviceBatch& b = batches.emplace_back();
      b.images = input_images.clone();
      b.targets = at::arange(B, at::kLong).remainder(K);
      b.step = step;
      const MixDraw d = draw_mix(21, step, 0, mixup, cutmix, W, H);
      t->apply(b);
      input += fmt::format("{} {} {} {} {} {} {} {} {}\n", mixup > 0 ? "mixup" : "cutmix", d.lam_drawn, d.box.rx,
                           d.box.ry, B, C, H, W, K);
      if (cutmix > 0) {
        EXPECT_FALSE(b.images.equal(input_images));  // something was pasted, from the previous image
      }
    }
  }
  std::istringstream out(run_python_stdin(kMixOracle, input));  // one Python for every batch
  for (const DeviceBatch& b : batches) {
    std::vector<float> images(static_cast<size_t>(B * C * H * W)), targets(static_cast<size_t>(B * K));
    for (auto& v : images) ASSERT_TRUE(out >> v);
    for (auto& v : targets) ASSERT_TRUE(out >> v);
    const at::Tensor want_images = at::tensor(images).reshape({B, C, H, W});
    const at::Tensor want_targets = at::tensor(targets).reshape({B, K});
    ASSERT_EQ(b.targets.sizes(), want_targets.sizes());
    EXPECT_TRUE(at::allclose(b.images.contiguous(), want_images, 0, 1e-7)) << "step " << b.step;
    EXPECT_TRUE(at::allclose(b.targets, want_targets, 0, 1e-7)) << b.targets << want_targets;
  }
}

// v2.RandomErasing on each sample with crucible's draws for it: torch.rand(1) (apply or not),
// each try's torch.empty(1).uniform_ (the area share, then the log ratio) and the two
// torch.randint (top, left). Writes every sample's image as float32 to the output path.
constexpr const char* kEraseOracle = R"PY(
import struct, sys, torch
from torchvision.transforms import v2
lines = sys.stdin.read().strip().splitlines()
out_path = lines[0]
B, C, H, W = (int(v) for v in lines[1].split())
p, s0, s1, r0, r1 = (float(v) for v in lines[2].split())
value = [float(v) for v in lines[3].split()]
x = ((torch.arange(B * C * H * W) % 251).to(torch.float32).div(251) + 10).reshape(B, C, H, W)
class Uniform:
    def __init__(self, queue): self.queue = queue
    def uniform_(self, lo, hi): return torch.tensor([self.queue.pop(0)], dtype=torch.float32)
real = (torch.rand, torch.empty, torch.randint)
outs = []
for i, line in enumerate(lines[4:]):
    f = line.split()
    apply_draw, tries = float(f[0]), int(f[1])
    uniforms = [float(v) for v in f[2:2 + 2 * tries]]
    ints = [int(v) for v in f[2 + 2 * tries:]]
    t = v2.RandomErasing(p=p, scale=(s0, s1), ratio=(r0, r1), value=value)
    torch.rand = lambda *a, **k: torch.tensor([apply_draw], dtype=torch.float32)
    torch.empty = lambda *a, **k: Uniform(uniforms)
    torch.randint = lambda *a, **k: torch.tensor([ints.pop(0)])
    try:
        y = t(x[i].clone())
    finally:
        torch.rand, torch.empty, torch.randint = real
    assert not uniforms and not ints, f"sample {i}: torchvision drew fewer values than crucible"
    outs.append(y)
open(out_path, 'wb').write(torch.stack(outs).contiguous().numpy().tobytes())
)PY";

TEST(RandomErasing, EachSampleEqualsTorchvisionsGivenTheSameDraws) {
  SKIP_WITHOUT_V2();
  const int64_t B = 120, C = 3, H = 20, W = 30;
  const double p = 0.6;
  const std::vector<double> value = {0.5, -1.0, 2.0};
  auto t = random_erasing_transform(5, p, {0.02, 0.33}, {0.3, 3.3}, value);
  DeviceBatch b;
  b.images = (at::arange(B * C * H * W, at::kLong).remainder(251).to(at::kFloat).div(251) + 10).reshape({B, C, H, W});
  b.targets = at::zeros({B}, at::kLong);
  b.epoch = 2;
  for (int64_t i = 0; i < B; ++i) b.sample_ids.push_back(300 + 3 * i);
  t->apply(b);
  test::TempDir d;
  std::string input = fmt::format("{}\n{} {} {} {}\n{} 0.02 0.33 0.3 3.3\n{}\n", d / "theirs.f32", B, C, H, W, p,
                                  fmt::join(value, " "));
  int erased = 0, missed = 0;
  for (int64_t i = 0; i < B; ++i) {
    const EraseBox e = draw_erase(5, 2, 300 + 3 * i, p, 0.02, 0.33, 0.3, 3.3, W, H);
    input += fmt::format("{:.9g} {}", e.apply_draw, e.tries);
    for (int k = 0; k < e.tries; ++k) input += fmt::format(" {:.9g} {:.9g}", e.tried[k].first, e.tried[k].second);
    if (e.erase) input += fmt::format(" {} {}", e.top, e.left);
    input += "\n";
    erased += e.erase;
    missed += e.tries > 1;  // a try that did not fit came first
  }
  run_python_stdin(kEraseOracle, input);
  const std::string bytes = test::read_text(d / "theirs.f32");
  ASSERT_EQ(bytes.size(), static_cast<size_t>(B * C * H * W) * sizeof(float));
  const at::Tensor theirs = at::from_blob(const_cast<char*>(bytes.data()), {B, C, H, W}, at::kFloat).clone();
  for (int64_t i = 0; i < B; ++i) EXPECT_TRUE(b.images[i].equal(theirs[i])) << "sample " << 300 + 3 * i;
  EXPECT_GT(erased, B / 3);   // the comparison covers erased samples …
  EXPECT_LT(erased, B);       // … and samples left alone
  std::printf("random erasing vs v2.RandomErasing: %lld samples equal (%d erased, %d after a try that did not fit)\n",
              static_cast<long long>(B), erased, missed);
}

TEST(RandomErasing, FollowsTorchvisionsRulesPerSampleAndLeavesTheRestAlone) {
  const int64_t B = 400, C = 3, H = 20, W = 30;
  const double p = 0.4;
  auto t = random_erasing_transform(5, p, {0.02, 0.33}, {0.3, 3.3}, {0.5, -1.0, 2.0});
  DeviceBatch b;
  b.images = at::rand({B, C, H, W}) + 10;  // never equal to an erasing value
  const at::Tensor before = b.images.clone();
  b.targets = at::zeros({B}, at::kLong);
  b.epoch = 3;
  for (int64_t i = 0; i < B; ++i) b.sample_ids.push_back(1000 + 7 * i);
  t->apply(b);
  int erased = 0;
  const at::Tensor value = at::tensor({0.5, -1.0, 2.0}, at::kFloat).view({C, 1, 1});
  for (int64_t i = 0; i < B; ++i) {
    const EraseBox e = draw_erase(5, 3, 1000 + 7 * i, p, 0.02, 0.33, 0.3, 3.3, W, H);
    at::Tensor want = before[i].clone();
    if (e.erase) {
      ++erased;
      const double area = static_cast<double>(e.h * e.w) / static_cast<double>(H * W);
      EXPECT_GE(area, 0.02 * 0.5) << i;  // rounding of h and w moves the area a little
      EXPECT_LE(area, 0.33 * 1.6) << i;
      EXPECT_LT(e.h, H);
      EXPECT_LT(e.w, W);
      EXPECT_LE(e.top + e.h, H);
      EXPECT_LE(e.left + e.w, W);
      want.slice(1, e.top, e.top + e.h).slice(2, e.left, e.left + e.w).copy_(value.expand({C, e.h, e.w}));
    }
    EXPECT_TRUE(b.images[i].equal(want)) << "sample " << i;
  }
  EXPECT_LT(std::abs(erased - p * B), 4.5 * std::sqrt(B * p * (1 - p))) << erased << " of " << B;
  // Per sample, from (seed, epoch, sample): another epoch erases elsewhere, the same one the same.
  int moved = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const EraseBox a = draw_erase(5, 3, i, 1.0, 0.02, 0.33, 0.3, 3.3, W, H);
    const EraseBox again = draw_erase(5, 3, i, 1.0, 0.02, 0.33, 0.3, 3.3, W, H);
    const EraseBox other = draw_erase(5, 4, i, 1.0, 0.02, 0.33, 0.3, 3.3, W, H);
    EXPECT_EQ(a.top, again.top);
    EXPECT_EQ(a.w, again.w);
    moved += a.top != other.top || a.left != other.left || a.h != other.h;
  }
  EXPECT_GT(moved, 80);
}

}  // namespace
}  // namespace crucible::train
