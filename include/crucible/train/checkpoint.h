// Checkpoints that lose nothing (law 5). One safetensors file per checkpoint
// ("ckpt-<step>.safetensors", readable by Python's safetensors), holding tensors by name
// (model.*, optim.*, rng.*, metrics.*) and string metadata (step, epoch, position, times,
// config), plus a SHA-256 over all of it. Written atomically; the newest `keep` are kept;
// loading takes the newest that verifies and warns about each one it skips.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crucible/train/optimizer.h"  // NamedTensor

namespace crucible::train {

struct CheckpointData {
  std::vector<NamedTensor> tensors;            // CPU tensors, unique names
  std::map<std::string, std::string> meta;     // without the checksum key

  const at::Tensor* find(const std::string& name) const;
  // meta value parsed as an integer / double; throws bad_input naming `source` when absent.
  int64_t meta_int(const std::string& key, const std::string& source) const;
  double meta_double(const std::string& key, const std::string& source) const;
};

class CheckpointManager {
 public:
  // `dir` is created if missing. `keep` >= 1.
  CheckpointManager(std::string dir, int64_t keep);

  // Writes ckpt-<step>.safetensors atomically, then removes all but the newest `keep`.
  // Returns the path written.
  std::string save(int64_t step, const CheckpointData& data);

  // The newest checkpoint that reads and verifies, or nullopt if there is none. Each
  // unreadable or corrupt newer file is named in a warning. `path_out` gets its path.
  std::optional<CheckpointData> load_latest(std::string* path_out = nullptr) const;

  // Checkpoint files present, oldest first (by step).
  std::vector<std::string> list() const;
  // Removes every checkpoint and stray temporary file.
  void clear() const;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int64_t keep_;
};

// Reads and verifies one checkpoint file; throws bad_input naming the file and the problem.
CheckpointData read_checkpoint(const std::string& path);
// Writes one checkpoint file atomically (with its checksum).
void write_checkpoint(const std::string& path, const CheckpointData& data);

}  // namespace crucible::train
