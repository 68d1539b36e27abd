// An LMDB database of u32 label + encoded image values (sample_source.h: open_lmdb).
#include "crucible/data/formats/sample_source.h"

#include <lmdb.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "crucible/core/byte_order.h"
#include "crucible/core/error.h"
#include "format_util.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;
using namespace format_detail;

constexpr const char* kLmdbClassesKey = "__classes__";

struct LmdbEnv {
  MDB_env* env = nullptr;
  MDB_dbi dbi = 0;
  LmdbEnv() = default;
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;
  ~LmdbEnv() {
    if (env != nullptr) mdb_env_close(env);
  }
};

// A read transaction that keeps its values valid; it keeps the environment open (frees first).
struct LmdbTxn {
  std::shared_ptr<const LmdbEnv> env;
  MDB_txn* txn = nullptr;
  LmdbTxn(const LmdbTxn&) = delete;
  LmdbTxn& operator=(const LmdbTxn&) = delete;
  explicit LmdbTxn(std::shared_ptr<const LmdbEnv> e) : env(std::move(e)) {}
  ~LmdbTxn() {
    if (txn != nullptr) mdb_txn_abort(txn);
  }
};

int64_t lmdb_label(uint32_t v) { return v == 0xffffffffu ? -1 : int64_t{v}; }

class LmdbSource final : public SampleSource {
 public:
  explicit LmdbSource(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    const bool is_dir = fs::is_directory(path_, ec);
    if (!is_dir && !fs::is_regular_file(path_, ec)) throw bad_input("LMDB {} does not exist", path_);
    if (is_dir && !fs::exists(path_ + "/data.mdb", ec)) {
      throw bad_input("LMDB folder {} holds no data.mdb", path_);
    }
    auto env = std::make_shared<LmdbEnv>();
    int rc = mdb_env_create(&env->env);
    if (rc != 0) throw runtime_error("LMDB {}: cannot create an environment: {}", path_, mdb_strerror(rc));
    // MDB_NOTLS: a read transaction is not tied to its thread, so any thread may use or free it.
    unsigned flags = MDB_RDONLY | MDB_NOLOCK | MDB_NORDAHEAD | MDB_NOTLS | (is_dir ? 0u : unsigned{MDB_NOSUBDIR});
    rc = mdb_env_open(env->env, path_.c_str(), flags, 0644);
    if (rc != 0) {
      throw bad_input("{}: cannot open as LMDB: {}", path_, mdb_strerror(rc));
    }
    MDB_txn* txn = nullptr;
    rc = mdb_txn_begin(env->env, nullptr, MDB_RDONLY, &txn);
    if (rc != 0) throw runtime_error("LMDB {}: cannot begin a read transaction: {}", path_, mdb_strerror(rc));
    LmdbTxn guard(env);
    guard.txn = txn;
    rc = mdb_dbi_open(txn, nullptr, 0, &env->dbi);
    if (rc != 0) throw bad_input("LMDB {}: cannot open the main database: {}", path_, mdb_strerror(rc));
    MDB_cursor* cursor = nullptr;
    rc = mdb_cursor_open(txn, env->dbi, &cursor);
    if (rc != 0) throw runtime_error("LMDB {}: cannot open a cursor: {}", path_, mdb_strerror(rc));
    std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> cursor_guard(cursor, mdb_cursor_close);
    MDB_val key, value;
    int64_t max_label = -1;
    bool have_classes = false;
    for (rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)) {
      std::string k(static_cast<const char*>(key.mv_data), key.mv_size);
      if (k == kLmdbClassesKey) {
        classes_ = parse_classes(value);
        have_classes = true;
        continue;
      }
      if (value.mv_size < 4) {
        throw bad_input("LMDB {}: the value of key \"{}\" holds {} bytes; expected a u32 label and an encoded image",
                        path_, printable(key.mv_data, key.mv_size), value.mv_size);
      }
      const int64_t label = lmdb_label(load_le32(static_cast<const uint8_t*>(value.mv_data)));
      max_label = std::max(max_label, label);
      keys_.push_back(std::move(k));
    }
    if (rc != MDB_NOTFOUND) throw runtime_error("LMDB {}: cannot iterate keys: {}", path_, mdb_strerror(rc));
    if (!have_classes) classes_ = numbered_classes(max_label);
    env_ = std::move(env);
  }

  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

  EncodedSample get(int64_t index) const override {
    const std::string& k = keys_.at(static_cast<size_t>(index));
    auto txn = std::make_shared<LmdbTxn>(env_);
    int rc = mdb_txn_begin(env_->env, nullptr, MDB_RDONLY, &txn->txn);
    if (rc != 0) {
      txn->txn = nullptr;
      throw runtime_error("LMDB {}: cannot begin a read transaction for key \"{}\": {}", path_, name_of(k),
                          mdb_strerror(rc));
    }
    MDB_val key{k.size(), const_cast<char*>(k.data())}, value{0, nullptr};
    rc = mdb_get(txn->txn, env_->dbi, &key, &value);
    if (rc != 0) throw runtime_error("LMDB {}: cannot read key \"{}\": {}", path_, name_of(k), mdb_strerror(rc));
    if (value.mv_size < 4) {
      throw bad_input("LMDB {}: the value of key \"{}\" holds {} bytes; expected a u32 label and an encoded image",
                      path_, name_of(k), value.mv_size);
    }
    const auto* p = static_cast<const uint8_t*>(value.mv_data);
    EncodedSample s;
    s.data = p + 4;
    s.size = value.mv_size - 4;
    s.hold = std::shared_ptr<const void>(std::move(txn), s.data);  // values live as long as their txn
    s.label = lmdb_label(load_le32(p));
    s.name = name_of(k);
    return s;
  }

  const std::vector<std::string>& classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("LMDB {}: {} samples in {} classes", path_, keys_.size(), classes_.size());
  }
  int files_held() const override { return 1; }  // D6: data.mdb stays open (no lock file)

 private:
  static std::string name_of(const std::string& key) { return printable(key.data(), key.size(), 256); }

  std::vector<std::string> parse_classes(const MDB_val& v) const {
    try {
      auto j = nlohmann::json::parse(static_cast<const char*>(v.mv_data),
                                     static_cast<const char*>(v.mv_data) + v.mv_size);
      return j.get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw bad_input("LMDB {}: key {} should hold a JSON list of class names: {}", path_, kLmdbClassesKey, e.what());
    }
  }

  std::string path_;
  std::shared_ptr<const LmdbEnv> env_;
  std::vector<std::string> keys_;
  std::vector<std::string> classes_;
};

}  // namespace

std::unique_ptr<SampleSource> open_lmdb(const std::string& path) { return std::make_unique<LmdbSource>(path); }

namespace format_detail {
// A folder holding data.mdb, or a .mdb file.
SampleFormat lmdb_format() {
  return {"lmdb", "an LMDB folder (holding data.mdb)",
          [](const std::string& path, bool exists, bool is_dir) {
            std::error_code ec;
            if (!exists) return false;
            return is_dir ? fs::is_regular_file(path + "/data.mdb", ec) : ends_with(lower_ascii(path), ".mdb");
          },
          [](const std::string& path, const SourceOptions&) { return open_lmdb(path); }};
}
}  // namespace format_detail

}  // namespace crucible::data
