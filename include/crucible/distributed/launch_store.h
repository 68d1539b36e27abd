// LaunchStore (launch.h) on c10d's TCPStore, for crucible-torch's launch. Torch-free header.
#pragma once

#include <memory>
#include <string>

#include "crucible/distributed/launch.h"

namespace crucible::distributed {

// A LaunchStoreOpener: serves the store at host:port (`serve`) or connects to it, each call
// waiting up to timeout_s. Throws when it cannot (the port is taken; nobody serves it).
std::unique_ptr<LaunchStore> open_tcp_launch_store(const std::string& host, int port, bool serve, double timeout_s);

}  // namespace crucible::distributed
