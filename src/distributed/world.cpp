#include "crucible/distributed/world.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "crucible/core/error.h"

namespace crucible::distributed {
namespace {

// An integer variable, or `fallback` when unset.
int int_var(const std::function<const char*(const char*)>& getenv, const char* name, int fallback, int lo) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > 1 << 24) {
    throw bad_input("environment variable {}=\"{}\": expected an integer ≥ {}", name, v, lo);
  }
  return static_cast<int>(x);
}

}  // namespace

std::string World::describe() const {
  return fmt::format("rank {} of {} (local {} of {} on node {}), rendezvous {}:{}", rank, size, local_rank, local_size,
                     node_rank, master_addr, master_port);
}

World world_from_env(const std::function<const char*(const char*)>& getenv) {
  World w;
  const char* ws = getenv("WORLD_SIZE");
  if (ws == nullptr || *ws == '\0') return w;  // not launched: one process
  w.size = int_var(getenv, "WORLD_SIZE", 1, 1);
  w.rank = int_var(getenv, "RANK", 0, 0);
  if (w.rank >= w.size) throw bad_input("RANK={} but WORLD_SIZE={}: a rank must be below the world size", w.rank, w.size);
  w.launched = true;
  for (const char* name : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') {
      throw bad_input("WORLD_SIZE={} but {} is not set: start the processes with crucible launch or torchrun (they "
                      "set RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                      w.size, name);
    }
  }
  // LOCAL_RANK is the device index (T2): guessing it from RANK is the multi-node hang.
  const char* local = getenv("LOCAL_RANK");
  if (local == nullptr || *local == '\0') {
    throw bad_input("WORLD_SIZE={} but LOCAL_RANK is not set: the device of a process comes from LOCAL_RANK, never "
                    "from RANK (T2); set it (crucible launch and torchrun do)",
                    w.size);
  }
  w.local_rank = int_var(getenv, "LOCAL_RANK", 0, 0);
  w.local_size = int_var(getenv, "LOCAL_WORLD_SIZE", w.local_rank + 1, 1);
  if (w.local_rank >= w.local_size) {
    throw bad_input("LOCAL_RANK={} but LOCAL_WORLD_SIZE={}: a local rank must be below it", w.local_rank, w.local_size);
  }
  if (w.local_size > w.size) {
    throw bad_input("LOCAL_WORLD_SIZE={} exceeds WORLD_SIZE={}", w.local_size, w.size);
  }
  w.node_rank = int_var(getenv, "GROUP_RANK", w.rank / w.local_size, 0);
  w.master_addr = getenv("MASTER_ADDR");
  w.master_port = int_var(getenv, "MASTER_PORT", 29500, 1);
  if (w.master_port > 65535) throw bad_input("MASTER_PORT={}: expected a port 1–65535", w.master_port);
  return w;
}

World world_from_env() {
  return world_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

void check_devices(const World& world, int device_count) {
  if (device_count <= 0) return;
  if (world.local_size > device_count) {
    throw bad_input("LOCAL_WORLD_SIZE={} processes on this machine but it has {} GPU(s): one process per device "
                    "(law 7, T2); start at most {} per machine",
                    world.local_size, device_count, device_count);
  }
}

}  // namespace crucible::distributed
