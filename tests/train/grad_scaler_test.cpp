// T1: the C++ GradScaler follows PyTorch's documented update rule on a scripted sequence of
// finite / non-finite steps (the expected values are the rule applied by hand), unscales
// gradients, and its state survives a checkpoint file.
#include "crucible/train/grad_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "crucible/train/checkpoint.h"
#include "test_util.h"

namespace crucible::train {
namespace {

TEST(GradScaler, FollowsPytorchUpdateRule) {
  GradScalerOptions o;
  o.enabled = true;
  o.init_scale = 8.0;
  o.interval = 3;
  GradScaler s(o);
  // found_inf per step → (step taken, scale after, growth tracker after), from the rule:
  // inf: skip, ×0.5, tracker 0; finite: take, tracker+1, at 3: ×2 and tracker 0.
  const struct {
    bool inf;
    bool take;
    double scale;
    int64_t tracker;
  } steps[] = {{false, true, 8, 1},  {false, true, 8, 2}, {false, true, 16, 0}, {true, false, 8, 0},
               {false, true, 8, 1},  {true, false, 4, 0}, {true, false, 2, 0},  {false, true, 2, 1},
               {false, true, 2, 2},  {false, true, 4, 0}, {false, true, 4, 1}};
  int i = 0;
  for (const auto& st : steps) {
    EXPECT_EQ(s.update(st.inf), st.take) << "step " << i;
    EXPECT_DOUBLE_EQ(s.scale(), st.scale) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), st.tracker) << "step " << i;
    ++i;
  }
}

TEST(GradScaler, DefaultsAreTorchs) {
  GradScaler s(GradScalerOptions{true});
  EXPECT_DOUBLE_EQ(s.scale(), 65536.0);
  for (int k = 0; k < 1999; ++k) s.update(false);
  EXPECT_DOUBLE_EQ(s.scale(), 65536.0);
  s.update(false);  // the 2000th clean step
  EXPECT_DOUBLE_EQ(s.scale(), 131072.0);
}

TEST(GradScaler, ScalesLossAndUnscalesGrads) {
  GradScaler s(GradScalerOptions{true, 4.0});
  at::Tensor loss = at::tensor({1.5f});
  EXPECT_FLOAT_EQ(s.scale_loss(loss).item<float>(), 6.0f);
  at::Tensor g = at::full({3}, 8.0f);
  s.unscale({g, at::Tensor()});
  EXPECT_TRUE(at::equal(g, at::full({3}, 2.0f)));
  GradScaler off;
  EXPECT_TRUE(at::equal(off.scale_loss(loss), loss));
  EXPECT_TRUE(off.update(false));
  EXPECT_FALSE(off.update(true));  // disabled: a non-finite step is still not taken
}

TEST(GradScaler, NamesTheFirstNonFiniteTensor) {
  std::vector<at::Tensor> t = {at::ones({2}), at::tensor({1.0f, std::numeric_limits<float>::quiet_NaN()}),
                               at::tensor({INFINITY})};
  EXPECT_FALSE(all_finite(t));
  EXPECT_EQ(first_non_finite({"a", "b", "c"}, t), "b");
  EXPECT_TRUE(all_finite({at::ones({2}), at::Tensor()}));
}

// The save/restore the Trainer's checkpoints use, through a real checkpoint file: scale and
// growth counter (not 0 here) come back, and the two scalers then agree step by step. The
// end-to-end kill-and-resume is TrainCli.LossScaleSurvivesAResumeT1.
TEST(GradScaler, StateSurvivesACheckpointT1) {
  test::TempDir d;
  GradScaler s(GradScalerOptions{true, 1024.0, 2.0, 0.5, 5});
  s.update(false);
  s.update(true);
  s.update(false);
  s.update(false);
  ASSERT_EQ(s.growth_tracker(), 2);
  CheckpointData c;
  s.save(c);
  write_checkpoint(d / "c", c);
  CheckpointData r = read_checkpoint(d / "c");
  GradScaler t(GradScalerOptions{true, 1.0, 2.0, 0.5, 5});  // same rule, another starting scale
  t.restore(r, d / "c");
  EXPECT_EQ(t.scale(), s.scale());
  EXPECT_EQ(t.growth_tracker(), s.growth_tracker());
  for (int k = 0; k < 6; ++k) EXPECT_EQ(t.update(k == 3), s.update(k == 3));
  EXPECT_EQ(t.scale(), s.scale());
}

}  // namespace
}  // namespace crucible::train
