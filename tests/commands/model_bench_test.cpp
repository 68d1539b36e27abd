// bench model's statistics: the p-th percentile interpolates between order statistics as
// NumPy's default does (numpy.percentile([1, 2, 3, 4], 90) == 3.7).
#include "crucible/commands/model_bench.h"

#include <gtest/gtest.h>

namespace crucible::commands {
namespace {

TEST(ModelBench, PercentilesAreNumpysX9) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(percentile({5}, 90), 5);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50, 60, 70, 80, 90, 100}, 90), 91);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3}, 100), 3);
}

}  // namespace
}  // namespace crucible::commands
