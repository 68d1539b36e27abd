// The launchers' store (LaunchStore, launch.h) on c10d's TCPStore: node 0's launcher serves it,
// the other nodes' launchers and every rank connect to it, as torchrun's agents and workers do.
#include "crucible/distributed/launch_store.h"

#include <chrono>

#include "../core/compat_dist.h"

namespace crucible::distributed {
namespace {

class TcpLaunchStore final : public LaunchStore {
 public:
  explicit TcpLaunchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::optional<std::string> try_get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  std::string set_once(const std::string& key, const std::string& value) override {
    // compareSet with an empty expected value sets a key that is unset and returns what it holds.
    const std::vector<uint8_t> v = store_->compareSet(key, {}, std::vector<uint8_t>(value.begin(), value.end()));
    return std::string(v.begin(), v.end());
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

std::unique_ptr<LaunchStore> open_tcp_launch_store(const std::string& host, int port, bool serve, double timeout_s) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  // world_size 1: the launchers' and ranks' connections are not counted (no one waits for them).
  return std::make_unique<TcpLaunchStore>(compat::make_tcp_store(host, port, serve, 1, timeout));
}

}  // namespace crucible::distributed
