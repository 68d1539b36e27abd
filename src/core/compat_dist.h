// c10d version differences (part of compat: every libtorch version test lives in compat.*).
// 1.13: ProcessGroupGloo/NCCL derive from c10d::ProcessGroup and take ProcessGroup::Options;
// 2.x: they derive from c10d::Backend (PR #88330). crucible builds the backend object directly
// and calls allreduce/broadcast/allgather/barrier on it, which both versions have with the same
// signatures. Heavy c10d headers: include from src/distributed/*.cpp only.
#pragma once

#include <chrono>
#include <string>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace crucible::compat {

#if TORCH_VERSION_MAJOR >= 2
using CommBackend = c10d::Backend;
#else
using CommBackend = c10d::ProcessGroup;
#endif

// A TCPStore client (and server when `is_server`; port 0 picks a free port, see store_port).
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                               std::chrono::milliseconds timeout);
// The port a TCPStore listens on (the chosen one when it was created with port 0).
int store_port(const c10::intrusive_ptr<c10d::Store>& store);

// Gloo over TCP on the interface that reaches `master_addr` (GLOO_SOCKET_IFNAME when set).
c10::intrusive_ptr<CommBackend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout, const std::string& master_addr);
// NCCL on `device`, bound to it before the first collective (T2). bad_input when this build
// has no NCCL (see nccl_available).
c10::intrusive_ptr<CommBackend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout, c10::Device device);
bool nccl_available();

}  // namespace crucible::compat
