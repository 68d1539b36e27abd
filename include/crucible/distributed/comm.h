// The process group of a data-parallel job: a TCPStore rendezvous (rank 0 hosts it) and one
// c10d backend — Gloo on CPU, NCCL on CUDA — built directly, so the same code runs on
// libtorch 1.13 and 2.x (core/compat_dist). Every collective has the job's timeout; when one
// fails because a rank died or hangs, the error names the missing rank(s), found through
// heartbeats each rank writes to the store. Not thread-safe, except that the asynchronous
// all-reduce may be launched from autograd's thread while the caller waits in backward().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "crucible/distributed/world.h"
#include "crucible/nn/collective.h"

namespace crucible::distributed {

struct CommOptions {
  std::string backend = "auto";  // "auto" (nccl for a CUDA device, else gloo) | "gloo" | "nccl"
  double timeout_s = 300;
  // Seconds between heartbeats (used to name a rank that stopped answering).
  double heartbeat_s = 1.0;
};

// A collective in flight.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

class Comm final : public nn::Collective {
 public:
  // Rendezvous at world.master_addr:master_port (rank 0 starts the store there; port 0 is for
  // tests: rank 0 picks one and passes it on through `chosen_port`). Binds nothing: the caller
  // has bound the device from LOCAL_RANK already (T2).
  static std::unique_ptr<Comm> connect(const World& world, c10::Device device, const CommOptions& options,
                                       int* chosen_port = nullptr);
  ~Comm() override;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& backend() const;
  c10::Device device() const;

  void broadcast(at::Tensor& t, int root);  // in place
  void all_reduce_sum(at::Tensor& t) override;
  std::unique_ptr<Pending> all_reduce_sum_async(const at::Tensor& t);  // in place when waited
  at::Tensor all_gather(const at::Tensor& t) override;
  // Different sizes along dim 0 allowed: rank order, concatenated.
  at::Tensor all_gather_varying(const at::Tensor& t);
  void barrier();

  // X3: small values through the store. Rank `root` publishes `value`; every rank returns it.
  std::string broadcast_string(const std::string& key, const std::string& value, int root);

  // Number of collectives issued (tests check M5's "no communication" on this).
  int64_t collectives() const;

 private:
  struct Impl;
  explicit Comm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// X3, X8: rank 0 runs `make` (write a file atomically, fetch or unpack something once) while
// the other ranks wait; then all go on and may read what it made. With no comm (one process)
// it just runs `make`. When `make` throws on rank 0, the others fail too, naming `what`.
void rank0_then_all(Comm* comm, const std::string& what, const std::function<void()>& make);

}  // namespace crucible::distributed
