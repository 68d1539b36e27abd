// Where this process stands in a data-parallel job, from the variables torchrun sets (and
// crucible launch): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// (reference: torch/distributed/run.py); without them, from SLURM's in an srun step
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, the tasks per node, the master the
// first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST). torchrun's win when both are set. No WORLD_SIZE means one
// process outside any launcher; WORLD_SIZE=1 is a launched job of one (it still joins a process
// group, as torchrun's single-process DDP does). The device is bound from LOCAL_RANK, never from RANK (T2). Torch-free.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace crucible::distributed {

struct World {
  int rank = 0;              // global rank, 0 … size-1
  int size = 1;              // WORLD_SIZE
  int local_rank = 0;        // rank on this machine: selects the device (T2)
  int local_size = 1;        // LOCAL_WORLD_SIZE: processes on this machine
  int node_rank = 0;         // GROUP_RANK when set, else rank / local_size
  std::string master_addr = "127.0.0.1";
  std::string master_addr_from;  // where master_addr came from: "MASTER_ADDR", "SLURM_STEP_NODELIST", …
  int master_port = 29500;

  bool launched = false;     // started by a launcher (WORLD_SIZE set, even to 1): join a process group
  std::string launcher;      // "torchrun" (its variables: torchrun, crucible launch) or "slurm"; "" when not launched
  int restarts = 0;          // TORCHELASTIC_RESTART_COUNT: how often the launcher has restarted the group
  std::string restart_causes;  // crucible launch's JSON list of why (kRestartCausesEnv), "" when not given
  // TORCHELASTIC_RUN_ID: set by the launchers that restart their ranks (torchrun, crucible
  // launch), whose process then keeps the run folder between restarts (core/folder_lock.h).
  std::string run_id;
  // TORCHELASTIC_USE_AGENT_STORE=True (torchrun, crucible launch --nnodes > 1): the launcher on
  // node 0 already serves the store at MASTER_ADDR:MASTER_PORT, so every rank, rank 0 too, is a
  // client of it, with keys under a prefix per restart (a restarted group never reads the last
  // group's keys).
  bool agent_store = false;
  bool distributed() const { return size > 1; }
  bool is_main() const { return rank == 0; }
  // "rank 1 of 4 (local 1 of 2 on node 0), rendezvous 10.0.0.1:29500"
  std::string describe() const;
};

// Reads the environment through `getenv` (tests pass their own). Throws bad_input naming the
// variable when one is malformed, inconsistent (RANK ≥ WORLD_SIZE, LOCAL_RANK ≥
// LOCAL_WORLD_SIZE, …) or missing while WORLD_SIZE > 1 needs it.
World world_from_env(const std::function<const char*(const char*)>& getenv);
World world_from_env();  // the process environment

// The hosts of a SLURM node list, in order: "node[01-03,7],gpu-a[1-2]x" → node01 node02 node03
// node7 gpu-a1x gpu-a2x (zero padding kept from the range's first bound; several bracket groups
// in one name multiply out). Written here because no test machine has scontrol. Throws
// bad_input naming `what` for an unbalanced bracket, an empty item or a range that runs
// backwards.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what);

// Resolves `host` (getaddrinfo, as the store's client will) and throws bad_input naming it and
// `from`, the variable or option it came from, when it does not resolve: a typo or a node list
// naming an unknown host ends within seconds instead of every rank retrying the connection until
// dist.timeout_s. A temporary resolver failure (EAI_AGAIN: DNS down) is retried for up to
// `retry_s` seconds first.
void check_host_resolves(const std::string& host, const std::string& from, double retry_s = 5);

// T2: a device count of 0 means CPU (any number of processes may share it); otherwise each
// process on this machine needs its own device: bad_input when LOCAL_WORLD_SIZE exceeds it.
void check_devices(const World& world, int device_count);

}  // namespace crucible::distributed
