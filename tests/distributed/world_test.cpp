// World from torchrun's variables (T2, X10): a plain process, a launched rank, and every
// malformed or inconsistent combination refused naming the variable.
#include "crucible/distributed/world.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

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

// torchrun's agent (and crucible launch on several nodes) serves the store itself and says so
// with TORCHELASTIC_USE_AGENT_STORE, compared as torch compares it: the string "True".
TEST(World, TheLaunchersStoreIsUsedOnlyWhenTheAgentSaysTrue) {
  auto env = torchrun(0, 2, 0, 2);
  EXPECT_FALSE(from(env).agent_store);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "3";
  const World w = from(env);
  EXPECT_TRUE(w.agent_store);
  EXPECT_EQ(w.restarts, 3);  // the store's keys of this group go under attempt 3
  test::expect_contains(w.describe(), "rendezvous 10.0.0.7:29511 (the launcher's store)");
  for (const char* no : {"False", "true", "1", ""}) {
    env["TORCHELASTIC_USE_AGENT_STORE"] = no;
    EXPECT_FALSE(from(env).agent_store) << no;
  }
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

// srun's variables for task `rank` of a 2-node step of 4 tasks per node (issue 28: under srun
// without torchrun every process believed it was rank 0).
std::map<std::string, std::string> srun(int rank) {
  return {{"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", "8"},
          {"SLURM_STEP_NUM_TASKS", "8"},
          {"SLURM_LOCALID", std::to_string(rank % 4)},
          {"SLURM_NODEID", std::to_string(rank / 4)},
          {"SLURM_NNODES", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_NODELIST", "gpu[07-08],login1"}};
}

TEST(World, SlurmStepGivesEveryTaskItsRankAndTheFirstHostAsMasterT2) {
  for (int rank = 0; rank < 8; ++rank) {
    const World w = from(srun(rank));
    EXPECT_TRUE(w.launched);
    EXPECT_EQ(w.launcher, "slurm");
    EXPECT_EQ(w.rank, rank);
    EXPECT_EQ(w.size, 8);
    EXPECT_EQ(w.local_rank, rank % 4);  // the device (T2), never the global rank
    EXPECT_EQ(w.local_size, 4);
    EXPECT_EQ(w.node_rank, rank / 4);
    EXPECT_EQ(w.master_addr, "gpu07");
    EXPECT_EQ(w.master_port, 20000 + 123456 % 20000);  // the same on every task
  }
  auto env = srun(5);
  env["MASTER_PORT"] = "29600";
  env["MASTER_ADDR"] = "10.1.2.3";
  const World w = from(env);
  EXPECT_EQ(w.master_port, 29600);
  EXPECT_EQ(w.master_addr, "10.1.2.3");
  EXPECT_NE(w.describe().find("SLURM"), std::string::npos);
}

TEST(World, TorchrunVariablesWinOverSlurms) {
  auto env = srun(5);
  for (const auto& [k, v] : torchrun(1, 2, 1, 2)) env[k] = v;
  const World w = from(env);
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.master_addr, "10.0.0.7");
}

TEST(World, SlurmOutsideAStepIsOneProcessAndUnevenNodesCountTheirOwnTasks) {
  // An sbatch script itself (no srun step): one process, as before.
  auto env = srun(0);
  env.erase("SLURM_STEP_ID");
  EXPECT_FALSE(from(env).launched);
  // 3 tasks on the first node, 1 on the second; the job's node list when the step's is unset.
  env = srun(3);
  env["SLURM_STEP_NUM_TASKS"] = "4";
  env["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
  env["SLURM_LOCALID"] = "0";
  env["SLURM_NODEID"] = "1";
  env.erase("SLURM_STEP_NODELIST");
  World w = from(env);
  EXPECT_EQ(w.local_size, 1);
  EXPECT_EQ(w.master_addr, "gpu07");
  env["SLURM_NTASKS_PER_NODE"] = "2";  // --ntasks-per-node wins over the per-node list
  env["SLURM_LOCALID"] = "1";
  EXPECT_EQ(from(env).local_size, 2);
  env["SLURM_LOCALID"] = "2";
  test::expect_bad_input([&] { from(env); }, {"SLURM_LOCALID=2"});
  env = srun(8);
  test::expect_bad_input([&] { from(env); }, {"SLURM_PROCID=8", "8 tasks"});
  env = srun(0);
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_JOB_NODELIST");
  test::expect_bad_input([&] { from(env); }, {"MASTER_ADDR", "SLURM_STEP_NODELIST"});
}

TEST(World, SlurmNodeListsExpandAsScontrolShowHostnames) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node1", "L"), V({"node1"}));
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,7],gpu-a[1-2]x", "L"),
            V({"node01", "node02", "node03", "node7", "gpu-a1x", "gpu-a2x"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[08-09]", "L"), V({"r1n08", "r1n09", "r2n08", "r2n09"}));
  EXPECT_EQ(expand_slurm_nodelist("c[098-101]", "L"), V({"c098", "c099", "c100", "c101"}));
  test::expect_bad_input([] { expand_slurm_nodelist("node[1-3", "SLURM_JOB_NODELIST"); },
                         {"SLURM_JOB_NODELIST", "without its ']'"});
  test::expect_bad_input([] { expand_slurm_nodelist("node[3-1]", "L"); }, {"runs backwards"});
  test::expect_bad_input([] { expand_slurm_nodelist("a,,b", "L"); }, {"empty host name"});
  test::expect_bad_input([] { expand_slurm_nodelist("n[x]", "L"); }, {"not a number"});
}

}  // namespace
}  // namespace crucible::distributed
