// World from torchrun's variables (T2, X10): a plain process, a launched rank, and every
// malformed or inconsistent combination refused naming the variable.
#include "crucible/distributed/world.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::distributed {
namespace {

World from(const std::map<std::string, std::string>& env) {
  return world_from_env([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::map<std::string, std::string> torchrun(int rank, int size, int local_rank, int local_size) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(size)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_size)},
          {"MASTER_ADDR", "10.0.0.7"},
          {"MASTER_PORT", "29511"}};
}

TEST(World, NoVariablesIsOneProcessOutsideALauncher) {
  const World w = from({});
  EXPECT_FALSE(w.launched);
  EXPECT_FALSE(w.distributed());
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
}

TEST(World, TorchrunVariablesOfASecondNodeT2) {
  // Node 1 of 2 with 4 processes each: global rank 6 is local rank 2 (its device), never 6.
  auto env = torchrun(6, 8, 2, 4);
  env["GROUP_RANK"] = "1";
  const World w = from(env);
  EXPECT_TRUE(w.launched);
  EXPECT_TRUE(w.distributed());
  EXPECT_EQ(w.rank, 6);
  EXPECT_EQ(w.local_rank, 2);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.master_addr, "10.0.0.7");
  EXPECT_EQ(w.master_port, 29511);
  EXPECT_NO_THROW(check_devices(w, 4));
  test::expect_bad_input([&] { check_devices(w, 2); }, {"LOCAL_WORLD_SIZE=4", "2 GPU(s)"});
  EXPECT_NO_THROW(check_devices(w, 0));  // CPU: processes share it
}

TEST(World, ALaunchedJobOfOneStillJoins) {
  const World w = from(torchrun(0, 1, 0, 1));
  EXPECT_TRUE(w.launched);
  EXPECT_FALSE(w.distributed());
}

TEST(World, BadVariablesAreNamedT2) {
  auto env = torchrun(2, 2, 0, 2);
  test::expect_bad_input([&] { from(env); }, {"RANK=2", "WORLD_SIZE=2"});
  env = torchrun(1, 2, 1, 2);
  env.erase("LOCAL_RANK");
  test::expect_bad_input([&] { from(env); }, {"LOCAL_RANK is not set", "never from RANK"});
  env = torchrun(1, 2, 1, 2);
  env.erase("MASTER_ADDR");
  test::expect_bad_input([&] { from(env); }, {"MASTER_ADDR is not set", "crucible launch"});
  env = torchrun(1, 2, 1, 2);
  env["WORLD_SIZE"] = "two";
  test::expect_bad_input([&] { from(env); }, {"WORLD_SIZE=\"two\"", "integer"});
  env = torchrun(1, 2, 3, 2);
  test::expect_bad_input([&] { from(env); }, {"LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2"});
  env = torchrun(1, 2, 1, 2);
  env["MASTER_PORT"] = "70000";
  test::expect_bad_input([&] { from(env); }, {"MASTER_PORT=70000"});
}

}  // namespace
}  // namespace crucible::distributed
