// PyTorch .pt reader tests (in progress).
#include "crucible/io/pt.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace crucible::io {
namespace {

TEST(Pt, Placeholder) {}

}  // namespace
}  // namespace crucible::io
