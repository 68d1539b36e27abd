#include "crucible/distributed/comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <functional>
#include <utility>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../core/compat_dist.h"
#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"

namespace crucible::distributed {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

std::string first_line(const std::string& s) {
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string heartbeat_key(int rank) { return fmt::format("crucible/heartbeat/{}", rank); }

// A connection to the rendezvous store. Rank 0 serves it (`serve`), unless the launcher does
// (World::agent_store: torchrun, crucible launch --nnodes > 1): then every rank is a client and
// its keys go under "crucible/attempt-<restart>/", so a restarted group never finds the keys of
// the group before it in the store that outlived it.
c10::intrusive_ptr<c10d::Store> open_store(const World& w, bool serve, std::chrono::milliseconds timeout) {
  auto s = compat::make_tcp_store(w.master_addr, w.master_port, serve && !w.agent_store, w.size, timeout);
  if (!w.agent_store) return s;
  return c10::make_intrusive<c10d::PrefixStore>(fmt::format("crucible/attempt-{}", w.restarts), s);
}

}  // namespace

struct Comm::Impl {
  World world;
  c10::Device device{c10::kCPU};
  CommOptions options;
  std::string backend_name;
  c10::intrusive_ptr<c10d::Store> store;  // rank 0: the server
  c10::intrusive_ptr<compat::CommBackend> pg;
  std::atomic<int64_t> collectives{0};

  // Heartbeats: a thread with its own store connection bumps this rank's counter; a failed
  // collective compares every rank's counter over a few periods to name the silent ones.
  c10::intrusive_ptr<c10d::Store> hb_store;
  std::thread hb_thread;
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;

  ~Impl() { stop_heartbeat(); }

  void start_heartbeat() {
    hb_store = open_store(world, false, to_ms(options.timeout_s));
    hb_thread = std::thread([this] {
      int64_t beat = 0;
      std::unique_lock<std::mutex> lock(hb_mu);
      while (!hb_stop) {
        try {
          const std::string s = std::to_string(++beat);
          hb_store->set(heartbeat_key(world.rank), std::vector<uint8_t>(s.begin(), s.end()));
        } catch (const std::exception&) {
          return;  // the store is gone (rank 0 died); the failing collective says so
        }
        hb_cv.wait_for(lock, to_ms(options.heartbeat_s), [this] { return hb_stop; });
      }
    });
  }

  void stop_heartbeat() {
    {
      std::lock_guard<std::mutex> lock(hb_mu);
      hb_stop = true;
    }
    hb_cv.notify_all();
    if (hb_thread.joinable()) hb_thread.join();
  }

  // Reads every other rank's heartbeat counter (-1: never seen). Throws when the store is gone.
  std::vector<int64_t> beats(c10d::Store& s) {
    std::vector<int64_t> out(static_cast<size_t>(world.size), -1);
    for (int r = 0; r < world.size; ++r) {
      if (r == world.rank || !s.check({heartbeat_key(r)})) continue;
      const std::vector<uint8_t> v = s.get(heartbeat_key(r));
      out[static_cast<size_t>(r)] = std::stoll(std::string(v.begin(), v.end()));
    }
    return out;
  }

  // Why a collective failed, in terms of ranks.
  // This rank keeps beating meanwhile: the other survivors are diagnosing too.
  std::string diagnose() {
    const std::string store_addr = fmt::format("{}:{}", world.master_addr, world.master_port);
    const double window = std::max(2.0, 2.5 * options.heartbeat_s);
    try {
      auto s = open_store(world, false, to_ms(window));
      const std::vector<int64_t> before = beats(*s);
      std::this_thread::sleep_for(to_ms(window));
      const std::vector<int64_t> after = beats(*s);
      std::vector<int> silent;
      for (int r = 0; r < world.size; ++r) {
        if (r != world.rank && (after[static_cast<size_t>(r)] < 0 || after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)])) {
          silent.push_back(r);
        }
      }
      if (silent.empty()) return "every other rank still sends heartbeats (one may be stuck outside collectives, or the network failed)";
      return fmt::format("{} {} stopped answering (no heartbeat for {:.0f} s): {} or hangs, or the network to {} "
                         "failed",
                         silent.size() == 1 ? "rank" : "ranks", fmt::join(silent, ", "), window,
                         silent.size() == 1 ? "it died" : "they died", silent.size() == 1 ? "it" : "them");
    } catch (const std::exception&) {
      if (world.agent_store) {
        // Node 0's ranks are 0 … local_size-1 (every node runs the same number).
        const std::string ranks = world.local_size == 1 ? "rank 0" : fmt::format("ranks 0–{}", world.local_size - 1);
        return fmt::format("node 0 ({}) stopped answering (the rendezvous store at {} that its launcher serves is "
                           "unreachable): that launcher died, or the network to node 0 failed",
                           ranks, store_addr);
      }
      if (world.rank == 0) return "the rendezvous store failed";
      return fmt::format("rank 0 stopped answering (the rendezvous store it hosts at {} is unreachable): it died, or "
                         "the network to it failed",
                         store_addr);
    }
  }

  [[noreturn]] void fail(const char* op, const std::exception& e) {
    const std::string why = diagnose();
    throw runtime_error("{} failed on rank {} of {}: {} [{}: {}]", op, world.rank, world.size,
                        why.empty() ? "see the backend's message" : why, backend_name, first_line(e.what()));
  }

  void run(const char* op, const c10::intrusive_ptr<c10d::Work>& work) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      fail(op, e);
    }
  }

  template <typename F>
  c10::intrusive_ptr<c10d::Work> issue(const char* op, F&& f) {
    ++collectives;
    try {
      return f();
    } catch (const std::exception& e) {
      fail(op, e);
    }
  }
};

namespace {

class FunctionPending final : public Pending {
 public:
  explicit FunctionPending(std::function<void()> f) : f_(std::move(f)) {}
  void wait() override {
    if (f_) std::exchange(f_, nullptr)();
  }

 private:
  std::function<void()> f_;
};

}  // namespace

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;

std::unique_ptr<Comm> Comm::connect(const World& world, c10::Device device, const CommOptions& options,
                                    int* chosen_port) {
  auto impl = std::make_unique<Impl>();
  impl->world = world;
  impl->device = device;
  impl->options = options;
  std::string backend = options.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl") {
    throw bad_input("dist.backend = \"{}\": expected auto, gloo or nccl", options.backend);
  }
  if (backend == "nccl" && !device.is_cuda()) {
    throw bad_input("dist.backend = \"nccl\" needs a CUDA device, this process runs on {}; use gloo", device.str());
  }
  impl->backend_name = backend;
  const auto timeout = to_ms(options.timeout_s);
  // A host that does not resolve would be retried until the timeout by every rank: say so now.
  check_host_resolves(world.master_addr, world.master_addr_from.empty() ? "MASTER_ADDR" : world.master_addr_from);
  try {
    impl->store = open_store(world, world.rank == 0, timeout);
  } catch (const std::exception& e) {
    const bool serve = world.rank == 0 && !world.agent_store;
    throw runtime_error("rank {}: cannot {} the rendezvous store at {}:{}{} within {:.0f} s: {}", world.rank,
                        serve ? "start" : "reach", world.master_addr, world.master_port,
                        world.agent_store ? " (the launcher's, TORCHELASTIC_USE_AGENT_STORE=True)" : "",
                        options.timeout_s, first_line(e.what()));
  }
  if (chosen_port != nullptr) {
    *chosen_port = world.agent_store ? world.master_port : compat::store_port(impl->store);
  }
  try {
    impl->pg = backend == "nccl"
                   ? compat::make_nccl(impl->store, world.rank, world.size, timeout, device)
                   : compat::make_gloo(impl->store, world.rank, world.size, timeout, world.master_addr);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // A launcher of another torch major version serves a store this libtorch's client cannot talk
    // to: the symptom is this timeout, so say it.
    const std::string agent_hint =
        world.agent_store ? fmt::format("; the store is the launcher's (TORCHELASTIC_USE_AGENT_STORE=True): a torchrun "
                                        "from a torch whose major version differs from this libtorch {} serves one "
                                        "this build cannot talk to (use crucible launch, or build crucible against "
                                        "the torch torchrun comes from)",
                                        compat::torch_version())
                          : "";
    throw runtime_error("rank {}: the {} process group of {} ranks did not form within {:.0f} s (a rank did not "
                        "start or cannot reach {}:{}{}): {}",
                        world.rank, backend, world.size, options.timeout_s, world.master_addr, world.master_port,
                        agent_hint, first_line(e.what()));
  }
  impl->start_heartbeat();
  return std::unique_ptr<Comm>(new Comm(std::move(impl)));
}

int Comm::rank() const { return impl_->world.rank; }
int Comm::size() const { return impl_->world.size; }
const std::string& Comm::backend() const { return impl_->backend_name; }
c10::Device Comm::device() const { return impl_->device; }
int64_t Comm::collectives() const { return impl_->collectives.load(); }

void Comm::broadcast(at::Tensor& t, int root) {
  std::vector<at::Tensor> ts = {t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->run("broadcast", impl_->issue("broadcast", [&] { return impl_->pg->broadcast(ts, o); }));
}

void Comm::all_reduce_sum(at::Tensor& t) {
  std::vector<at::Tensor> ts = {t};
  impl_->run("all-reduce", impl_->issue("all-reduce", [&] { return impl_->pg->allreduce(ts); }));
}

std::unique_ptr<Pending> Comm::all_reduce_sum_async(const at::Tensor& t) {
  std::vector<at::Tensor> ts = {t};
  auto work = impl_->issue("all-reduce", [&] { return impl_->pg->allreduce(ts); });
  Impl* impl = impl_.get();
  return std::make_unique<FunctionPending>([impl, work] { impl->run("all-reduce", work); });
}

at::Tensor Comm::all_gather(const at::Tensor& t) {
  const at::Tensor in = t.contiguous();
  std::vector<at::Tensor> inputs = {in};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(in));
  impl_->run("all-gather", impl_->issue("all-gather", [&] { return impl_->pg->allgather(outputs, inputs); }));
  return at::stack(outputs[0]);
}

// outside the step: evaluation and predict gather their per-sample rows (host reads below).
at::Tensor Comm::all_gather_varying(const at::Tensor& t) {
  const at::Tensor sizes = all_gather(at::full({1}, t.size(0), at::TensorOptions().dtype(at::kLong).device(t.device())))
                               .to(at::kCPU);  // outside the step: see above
  const int64_t most = sizes.max().item<int64_t>();  // outside the step: see above
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = most;
  at::Tensor padded = at::zeros(shape, t.options());
  if (t.size(0) > 0) padded.narrow(0, 0, t.size(0)).copy_(t);
  const at::Tensor all = all_gather(padded);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < size(); ++r) {
    parts.push_back(all[r].narrow(0, 0, sizes[r][0].item<int64_t>()));  // outside the step: see above
  }
  return at::cat(parts);
}

void Comm::barrier() {
  // A one-element all-reduce on this process's device rather than c10d's barrier, which on
  // NCCL guesses a device from the rank when it has not seen one yet (T2).
  at::Tensor t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(impl_->device));
  all_reduce_sum(t);
}

std::string Comm::broadcast_string(const std::string& key, const std::string& value, int root) {
  const std::string k = "crucible/value/" + key;
  try {
    if (rank() == root) {
      impl_->store->set(k, std::vector<uint8_t>(value.begin(), value.end()));
      return value;
    }
    const std::vector<uint8_t> v = impl_->store->get(k);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    impl_->fail("store broadcast", e);
  }
}

void rank0_then_all(Comm* comm, const std::string& what, const std::function<void()>& make) {
  if (comm == nullptr) {
    make();
    return;
  }
  std::exception_ptr error;
  if (comm->rank() == 0) {
    try {
      make();
    } catch (...) {
      error = std::current_exception();
    }
  }
  // The barrier carries rank 0's outcome.
  at::Tensor failed = at::full({1}, error ? 1.0f : 0.0f, at::TensorOptions().device(comm->device()));
  comm->all_reduce_sum(failed);
  if (error) std::rethrow_exception(error);
  // outside the step: set-up and checkpoint writes
  if (failed.item<float>() > 0) throw runtime_error("rank {}: rank 0 failed to {}; see its error", comm->rank(), what);
}

}  // namespace crucible::distributed
