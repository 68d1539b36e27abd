// torch.export's archives (.pt2, written by torch.export.save and torch.export.pt2_archive's
// package_pt2) read without libtorch: the programs' JSON (models/<name>.json), the weights and
// constants by name with their dtype, sizes, strides and storage offset, and their storages'
// bytes (viewed in the memory-mapped file where stored uncompressed). Also writes a copy of an
// archive with some members' bytes replaced (the trained weights written back). Torch-free:
// nn/exported.cpp makes tensors and runs the graphs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace crucible {
class MappedFile;
}

namespace crucible::io {

class ZipArchive;

// One entry of a program's weights or constants config (data/weights/<program>_weights_config.json).
struct Pt2Tensor {
  std::string name;    // the state_dict name ("conv.weight") or the constant's name
  std::string member;  // the archive member holding the bytes of its whole storage
  bool is_param = false;
  int serde_dtype = 0;  // torch._export.serde.schema.ScalarType (FLOAT = 7, LONG = 5, …)
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;
};

// A member's bytes: a view into the mapped archive (stored members) or a copy; `owner` keeps
// them alive.
struct Pt2Bytes {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<const void> owner;
};

class Pt2Archive {
 public:
  // Opens `path`. Throws bad_input naming the file when it is missing, not a zip, not a PT2
  // archive (archive_format), the flat layout of torch < 2.6 (serialized_exported_program.json),
  // or holds no program.
  explicit Pt2Archive(const std::string& path);
  ~Pt2Archive();
  Pt2Archive(const Pt2Archive&) = delete;
  Pt2Archive& operator=(const Pt2Archive&) = delete;

  const std::string& path() const { return path_; }
  // The archive's top folder with its slash ("net/"): every member is under it.
  const std::string& root() const { return root_; }
  // The programs by name (models/<name>.json): "model" for torch.export.save, "train" and
  // "eval" for crucible.export.
  const std::vector<std::string>& programs() const { return programs_; }
  bool has_program(const std::string& name) const;
  std::string program_json(const std::string& name) const;
  // The program's weights and constants configs (empty when the archive has none).
  std::vector<Pt2Tensor> weights(const std::string& program) const;
  std::vector<Pt2Tensor> constants(const std::string& program) const;
  bool has(const std::string& member) const;
  Pt2Bytes bytes(const std::string& member) const;

 private:
  std::vector<Pt2Tensor> payload(const std::string& config, const std::string& folder) const;

  std::string path_, root_;
  std::shared_ptr<const MappedFile> file_;
  std::unique_ptr<ZipArchive> zip_;
  std::vector<std::string> programs_;
};

// Writes `source`'s archive to `path` (atomically) with each member named in `replaced` holding
// the given bytes instead (stored uncompressed, as torch writes them); every other member is
// copied unchanged. Throws runtime_error naming the path on a failed write.
void write_pt2_replacing(const std::string& source, const std::string& path,
                         const std::map<std::string, std::string>& replaced);

}  // namespace crucible::io
