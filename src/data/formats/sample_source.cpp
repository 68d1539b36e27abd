// Sample sources (see sample_source.h): the evenly spaced subset, shard lists (brace patterns
// "name-{000000..000009}.tar") and open_samples, which asks each format in turn whether a path is
// one of it. Each format is a file of its own beside this one (image_folder.cpp, tar_shards.cpp,
// lmdb.cpp, packed.cpp) and one entry in formats() below.
#include "crucible/data/formats/sample_source.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "crucible/core/error.h"
#include "format_util.h"

namespace crucible::data {
namespace format_detail {
SampleFormat packed_format();
SampleFormat lmdb_format();
SampleFormat tar_shard_format();
SampleFormat coco_format();
SampleFormat yolo_format();
SampleFormat image_folder_format();
}  // namespace format_detail

namespace {

namespace fs = std::filesystem;
using namespace format_detail;

// The formats open_samples knows, in the order it asks them: the first that claims a path opens it.
const std::vector<SampleFormat>& formats() {
  static const std::vector<SampleFormat> list = {packed_format(), lmdb_format(),  tar_shard_format(),
                                                 coco_format(),   yolo_format(), image_folder_format()};
  return list;
}

// "accepted: a, b, c, or d", from the formats' own words.
std::string accepted() {
  std::string out = "accepted: ";
  const auto& list = formats();
  for (size_t i = 0; i < list.size(); ++i) {
    out += i == 0 ? "" : i + 1 == list.size() ? ", or " : ", ";
    out += list[i].accepts;
  }
  return out;
}

// ---- evenly spaced subset -------------------------------------------------------------------

class EvenSubset final : public SampleSource {
 public:
  EvenSubset(std::shared_ptr<const SampleSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_; }
  EncodedSample get(int64_t index) const override {
    if (index < 0 || index >= n_) throw std::out_of_range("EvenSubset::get: index out of range");
    return base_->get(base_index(index));
  }
  const std::vector<std::string>& classes() const override { return base_->classes(); }
  std::string describe() const override { return fmt::format("{} evenly spaced samples of {}", n_, base_->describe()); }
  int files_held() const override { return base_->files_held(); }
  int files_per_read() const override { return base_->files_per_read(); }
  std::vector<int64_t> shard_counts() const override {
    const std::vector<int64_t> base = base_->shard_counts();
    if (base.empty()) return {};
    std::vector<int64_t> out(base.size(), 0);
    size_t shard = 0;
    int64_t end = base[0];
    for (int64_t i = 0; i < n_; ++i) {  // base indices grow with i
      const int64_t b = base_index(i);
      while (b >= end) end += base[++shard];
      ++out[shard];
    }
    return out;
  }
  void plan(const std::vector<int64_t>& upcoming) const override {
    std::vector<int64_t> mapped(upcoming.size());
    for (size_t k = 0; k < upcoming.size(); ++k) mapped[k] = base_index(upcoming[k]);
    base_->plan(mapped);
  }
  bool remote_io(RemoteIo* out) const override { return base_->remote_io(out); }
  // Detection: the base's boxes, category ids and box counts, and its images' sizes by index.
  bool has_boxes() const override { return base_->has_boxes(); }
  std::vector<int64_t> category_ids() const override { return base_->category_ids(); }
  bool image_size(int64_t index, int* width, int* height) const override {
    if (index < 0 || index >= n_) return false;
    return base_->image_size(base_index(index), width, height);
  }
  BoxCounts box_counts() const override { return base_->box_counts(); }
  bool exif_orientation() const override { return base_->exif_orientation(); }

 private:
  // i × size / n without overflow for any size an index can hold (i < n ≤ size < 2^63).
  int64_t base_index(int64_t i) const {
    const auto wide = static_cast<unsigned __int128>(i) * static_cast<unsigned __int128>(base_->size());
    return static_cast<int64_t>(wide / static_cast<unsigned __int128>(n_));
  }

  std::shared_ptr<const SampleSource> base_;
  int64_t n_;
};

// ---- shard lists --------------------------------------------------------------------------

// Expands the first "{a..b}" (numeric, zero padding kept when either bound has it) or
// "{x,y,z}" group, recursively, like WebDataset's braceexpand.
void expand_braces(const std::string& pattern, std::vector<std::string>* out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    out->push_back(pattern);
    return;
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) throw bad_input("{}: unmatched '{{' in the shard pattern", pattern);
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open), tail = pattern.substr(close + 1);
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto all_digits = [](const std::string& s) {
      return !s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!all_digits(a) || !all_digits(b)) {
      throw bad_input("{}: expected a numeric range like {{000000..000009}}, found {{{}}}", pattern, body);
    }
    const int64_t lo = std::stoll(a), hi = std::stoll(b);
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const size_t width = padded ? std::max(a.size(), b.size()) : 0;
    if (std::abs(hi - lo) > 10000000) throw bad_input("{}: the range {{{}}} is too large", pattern, body);
    const int64_t step = hi >= lo ? 1 : -1;
    for (int64_t v = lo;; v += step) {
      std::string n = std::to_string(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      expand_braces(head + n + tail, out);
      if (v == hi) break;
    }
    return;
  }
  size_t start = 0;
  for (;;) {
    const size_t comma = body.find(',', start);
    expand_braces(head + body.substr(start, comma - start) + tail, out);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

// Splits at commas outside braces.
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '{') ++depth;
    if (c == '}' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  return parts;
}

}  // namespace

std::unique_ptr<SampleSource> subset_evenly(std::shared_ptr<const SampleSource> base, int64_t n) {
  if (base == nullptr) throw std::logic_error("subset_evenly: no base source");
  if (n < 1 || n > base->size()) {
    throw bad_input("{}: cannot take {} evenly spaced samples of the {} it holds (expected 1 to {})", base->describe(),
                    n, base->size(), base->size());
  }
  return std::make_unique<EvenSubset>(std::move(base), n);
}

std::string RemoteIo::line() const {
  return fmt::format("remote: {} requests ({} retries), {:.1f} MB; shard cache {}: {} downloads, {} hits, {} evictions, "
                     "{} failed checks, {:.1f} of {:.1f} MB used",
                     requests, retries, static_cast<double>(bytes) / 1e6, cache_dir, downloads, hits, evictions,
                     failed_checks, static_cast<double>(cache_used_bytes) / 1e6,
                     static_cast<double>(cache_max_bytes) / 1e6);
}

std::vector<std::string> expand_shard_list(const std::string& list) {
  std::vector<std::string> shards;
  for (const auto& part : split_top_level(list)) {
    if (!part.empty()) expand_braces(part, &shards);
  }
  return shards;
}

std::unique_ptr<SampleSource> open_samples(const std::string& path, const SourceOptions& options) {
  if (path.empty()) throw bad_input("empty data path; {}", accepted());
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  const bool is_dir = exists && fs::is_directory(path, ec);
  for (const SampleFormat& f : formats()) {
    if (f.claims(path, exists, is_dir)) return f.open(path, options);
  }
  if (!exists) throw bad_input("data path {} does not exist; {}", path, accepted());
  if (is_dir) {
    size_t files = 0;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) ++files;
    if (files == 0) throw bad_input("data folder {} is empty; {}", path, accepted());
    throw bad_input("data folder {} holds {} files but no index.crpk, data.mdb or class sub-folders; {}", path, files,
                    accepted());
  }
  throw bad_input("data path {} is a file that is neither a packed index (no \"CRPKIDX1\" magic), a tar shard nor an "
                  "LMDB data.mdb; {}",
                  path, accepted());
}

}  // namespace crucible::data
