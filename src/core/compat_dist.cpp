#include "compat_dist.h"

#include <cstdlib>

// Every libtorch crucible supports was built with Gloo; its header is guarded by this macro.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(CRUCIBLE_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "crucible/core/error.h"

namespace crucible::compat {

c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = is_server;
  o.numWorkers = static_cast<size_t>(world_size);
  o.waitWorkers = false;  // each rank waits in the process group's own rendezvous, under the same timeout
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

int store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  return tcp != nullptr ? static_cast<int>(tcp->getPort()) : 0;
}

c10::intrusive_ptr<CommBackend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout, const std::string& master_addr) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) {
    // One machine: the loopback interface (the default device resolves the hostname, which
    // containers often map to an unreachable address).
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

bool nccl_available() {
#if defined(CRUCIBLE_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<CommBackend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout, c10::Device device) {
#if defined(CRUCIBLE_WITH_NCCL)
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  pg->setBoundDeviceId(device);  // T2: never the rank % device-count guess
#endif
  return pg;
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw bad_input("dist.backend = \"nccl\" on {}: this crucible was built without NCCL (rebuild on a machine whose "
                  "libtorch has CUDA and nccl.h), or use dist.backend = \"gloo\"",
                  device.str());
#endif
}

}  // namespace crucible::compat
