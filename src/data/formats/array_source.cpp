// ArraySource: .npy / .npz / .safetensors features and labels, read from the memory map (D13).
#include "crucible/data/formats/array_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fp16.h>

#include "crucible/core/error.h"
#include "crucible/core/memory.h"
#include "crucible/core/mmap.h"
#include "crucible/io/npy.h"
#include "crucible/io/npz.h"
#include "crucible/io/safetensors.h"
#include "crucible/io/tensor_file.h"

namespace crucible::data {
namespace {

namespace fs = std::filesystem;

// A label past this is a corrupt file, not a class count (it would size the model's last layer).
constexpr int64_t kMaxClasses = int64_t{1} << 24;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The index in `names` of `want`, or of the only name when `want` is empty; bad_input naming
// the file `path` and listing the names otherwise.
size_t pick(const std::vector<std::string>& names, const std::string& want, const std::string& path) {
  if (!want.empty()) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == want) return i;
    }
    throw bad_input("{}: no array named '{}' (it holds: {})", path, want,
                    names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
  }
  if (names.size() == 1) return 0;
  if (names.empty()) throw bad_input("{}: holds no arrays", path);
  throw bad_input("{} holds {} arrays ({}): name the one to use as \"{}:NAME\", e.g. \"{}:{}\"", path, names.size(),
                  fmt::join(names, ", "), path, path, names[0]);
}

// Hand-written because libzip gives no member's offset in the archive: the bytes of zip
// directory entry `index` when it is stored (np.savez) rather than deflated, found through the
// central directory (zip64 too) and the member's local header; nullptr when it is compressed,
// encrypted, or any field does not add up (the caller then inflates it). Every read is bounded
// by `size`; only the directory and the local header are touched, never the data.
const uint8_t* stored_member(const uint8_t* d, size_t size, uint64_t index, const std::string& entry_name,
                             uint64_t entry_size) {
  auto u16 = [d](uint64_t o) { return uint64_t{d[o]} | uint64_t{d[o + 1]} << 8; };
  auto u32 = [&](uint64_t o) { return u16(o) | u16(o + 2) << 16; };
  auto u64 = [&](uint64_t o) { return u32(o) | u32(o + 4) << 32; };
  constexpr uint64_t k32 = 0xFFFFFFFFu;
  if (d == nullptr || size < 22) return nullptr;
  // End of central directory: the last "PK\5\6" in the final 22 + 65535 bytes (its comment).
  const uint64_t lo = size > 22 + 65535 ? size - 22 - 65535 : 0;
  uint64_t eocd = UINT64_MAX;
  for (uint64_t o = size - 22;; --o) {
    if (u32(o) == 0x06054b50) {
      eocd = o;
      break;
    }
    if (o == lo) break;
  }
  if (eocd == UINT64_MAX) return nullptr;
  uint64_t entries = u16(eocd + 10), cd = u32(eocd + 16);
  if (entries == 0xFFFF || cd == k32) {  // zip64 end of central directory, through its locator
    if (eocd < 20 || u32(eocd - 20) != 0x07064b50) return nullptr;
    const uint64_t z = u64(eocd - 20 + 8);
    if (z > size || size - z < 56 || u32(z) != 0x06064b50) return nullptr;
    entries = u64(z + 32);
    cd = u64(z + 48);
  }
  if (index >= entries) return nullptr;
  uint64_t o = cd;
  for (uint64_t k = 0;; ++k) {
    if (o > size || size - o < 46 || u32(o) != 0x02014b50) return nullptr;
    const uint64_t len = 46 + u16(o + 28) + u16(o + 30) + u16(o + 32);
    if (size - o < len) return nullptr;
    if (k == index) break;
    o += len;
  }
  const uint64_t flags = u16(o + 8), method = u16(o + 10), name_len = u16(o + 28), extra_len = u16(o + 30);
  uint64_t comp = u32(o + 20), usize = u32(o + 24), local = u32(o + 42);
  if (method != 0 || (flags & 1) != 0) return nullptr;  // deflated, or encrypted
  if (std::string(reinterpret_cast<const char*>(d + o + 46), name_len) != entry_name) return nullptr;
  if (usize == k32 || comp == k32 || local == k32) {
    // zip64 extra field (id 1): the 8-byte values of the fields that read 0xFFFFFFFF, in order.
    uint64_t x = o + 46 + name_len;
    const uint64_t end = x + extra_len;
    bool found = false;
    while (!found && end - x >= 4) {
      const uint64_t id = u16(x), len = u16(x + 2);
      if (end - x - 4 < len) return nullptr;
      if (id == 1) {
        uint64_t p = x + 4;
        const uint64_t pend = p + len;
        for (uint64_t* field : {&usize, &comp, &local}) {
          if (*field != k32) continue;
          if (pend - p < 8) return nullptr;
          *field = u64(p);
          p += 8;
        }
        found = true;
      }
      x += 4 + len;
    }
    if (!found) return nullptr;
  }
  if (usize != entry_size || comp != entry_size) return nullptr;
  if (local > size || size - local < 30 || u32(local) != 0x04034b50) return nullptr;
  const uint64_t start = local + 30 + u16(local + 26) + u16(local + 28);
  if (start > size || size - start < entry_size) return nullptr;
  return d + start;
}

bool same_header(const io::Array& a, const io::NpyHeader& h) {
  return a.dtype == h.dtype && a.shape == h.shape && !h.big_endian && !h.fortran_order;
}

int64_t label_value(io::DType t, const uint8_t* p, bool* too_big) {
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case io::DType::kU8:
      return *p;
    case io::DType::kI8:
      return static_cast<int8_t>(*p);
    case io::DType::kI16:
      return load(int16_t{});
    case io::DType::kU16:
      return load(uint16_t{});
    case io::DType::kI32:
      return load(int32_t{});
    case io::DType::kU32:
      return load(uint32_t{});
    case io::DType::kI64:
      return load(int64_t{});
    case io::DType::kU64: {
      const uint64_t v = load(uint64_t{});
      if (v > static_cast<uint64_t>(kMaxClasses)) *too_big = true;
      return static_cast<int64_t>(std::min<uint64_t>(v, static_cast<uint64_t>(kMaxClasses)));
    }
    default:
      return 0;
  }
}

bool is_integer_dtype(io::DType t) {
  switch (t) {
    case io::DType::kU8:
    case io::DType::kI8:
    case io::DType::kI16:
    case io::DType::kU16:
    case io::DType::kI32:
    case io::DType::kU32:
    case io::DType::kI64:
    case io::DType::kU64:
      return true;
    default:
      return false;
  }
}

bool is_feature_float(io::DType t) {
  return t == io::DType::kF32 || t == io::DType::kF64 || t == io::DType::kF16 || t == io::DType::kBF16;
}

// The first `n` labels of `a` (already checked: integers, shape [count]), checked for sign and size.
std::vector<int64_t> read_labels(const OpenedArray& a, int64_t n, int64_t* num_classes) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  const size_t item = io::dtype_size(a.array.dtype);
  const int64_t stride = a.array.strides.empty() ? 1 : a.array.strides[0];
  *num_classes = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool too_big = false;
    const int64_t v = label_value(a.array.dtype, a.array.data + i * stride * static_cast<int64_t>(item), &too_big);
    if (v < 0) {
      throw bad_input("{}: label {} at index {} is negative: labels are class indices 0, 1, …, classes - 1", a.where, v,
                      i);
    }
    if (too_big || v >= kMaxClasses) {
      throw bad_input(
          "{}: label at index {} is {}, not a class index (more than {} classes?): is this the labels "
          "file?",
          a.where, i, too_big ? std::string("above 2^24") : std::to_string(v), kMaxClasses);
    }
    out[static_cast<size_t>(i)] = v;
    *num_classes = std::max(*num_classes, v + 1);
  }
  return out;
}

// Element (i, j) of a 2-D array as a double; `ok` false for a dtype that holds no numbers.
double element(const io::Array& a, int64_t i, int64_t j, bool* ok) {
  const int64_t at = i * a.strides[0] + j * a.strides[1];
  const uint8_t* p = a.data + at * static_cast<int64_t>(io::dtype_size(a.dtype));
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (a.dtype) {
    case io::DType::kBool:
      return *p != 0 ? 1.0 : 0.0;
    case io::DType::kF32:
      return load(float{});
    case io::DType::kF64:
      return load(double{});
    case io::DType::kF16:
      return fp16_ieee_to_fp32_value(load(uint16_t{}));
    case io::DType::kBF16: {
      uint32_t bits = static_cast<uint32_t>(load(uint16_t{})) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default:
      if (!is_integer_dtype(a.dtype)) {
        *ok = false;
        return 0;
      }
      bool too_big = false;
      const int64_t v = label_value(a.dtype, p, &too_big);
      return too_big ? 2.0 : static_cast<double>(v);
  }
}

// Multi-label targets: the first `n` rows of `a` ([count, classes]: bool, integers or floats),
// each value 0 or 1 (integers, bool) or within 0–1 (floats: soft targets).
std::vector<float> read_targets(const OpenedArray& a, int64_t n) {
  const int64_t w = a.array.shape[1];
  if (w < 1 || w >= kMaxClasses) {
    throw bad_input("{}: multi-label targets need 1 to {} classes per row, found shape {}", a.where, kMaxClasses - 1,
                    a.array.shape_string());
  }
  const bool floats = is_feature_float(a.array.dtype);
  std::vector<float> out(static_cast<size_t>(n * w));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      bool ok = true;
      const double v = element(a.array, i, j, &ok);
      if (!ok) {
        throw bad_input("{}: labels of type {} hold no numbers: multi-label targets are bool, integer or float",
                        a.where, io::dtype_name(a.array.dtype));
      }
      if (floats ? !(v >= 0.0 && v <= 1.0) : (v != 0.0 && v != 1.0)) {
        throw bad_input("{}: sample {} class {} is {}: multi-label targets are {} (1 = the class is present)", a.where,
                        i, j, v, floats ? "within 0–1" : "0 or 1");
      }
      out[static_cast<size_t>(i * w + j)] = static_cast<float>(v);
    }
  }
  return out;
}

}  // namespace

ArrayRef parse_array_ref(const std::string& text) {
  std::error_code ec;
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || fs::exists(text, ec)) return {text, ""};
  const std::string path = text.substr(0, colon), name = text.substr(colon + 1);
  // "missing.npz:x" names missing.npz in the error; "a/b:c/d" (no such file) stays whole.
  if (fs::exists(path, ec) || name.find('/') == std::string::npos) return {path, name};
  return {text, ""};
}

OpenedArray open_array(const std::string& ref, uint64_t memory_budget) {
  const ArrayRef r = parse_array_ref(ref);
  auto file = MappedFile::open(r.path);
  const io::Format format = io::detect_format(file->data(), file->size());
  OpenedArray out;
  switch (format) {
    case io::Format::kNpy:
      if (!r.name.empty()) {
        throw bad_input(
            "{} is an .npy file, which holds one array: drop ':{}' (names pick arrays in .npz and "
            ".safetensors files)",
            r.path, r.name);
      }
      out.where = r.path;
      out.array = io::parse_npy(file->data(), file->size(), r.path, file);
      break;
    case io::Format::kNpz: {
      io::NpzArchive zip(file->data(), file->size(), r.path);
      std::vector<std::string> names;
      for (const auto& m : zip.members()) names.push_back(m.name);
      const std::string want = ends_with(r.name, ".npy") ? r.name.substr(0, r.name.size() - 4) : r.name;
      const io::NpzMember& m = zip.members()[pick(names, want, r.path)];
      out.where = r.path + ":" + m.name;
      // D13: a stored member is an .npy file inside the archive: view it in the mapping.
      bool viewed = false;
      if (const uint8_t* p = stored_member(file->data(), file->size(), m.index, m.name + ".npy", m.size)) {
        try {
          io::Array a = io::parse_npy(p, static_cast<size_t>(m.size), out.where, file);
          if (same_header(a, m.header)) {
            out.array = std::move(a);
            viewed = true;
          }
        } catch (const Error&) {
          // not what the directory said: inflate it below, where libzip checks it
        }
      }
      if (!viewed) {
        MemoryBudget budget(memory_budget);
        out.array = zip.read(m, budget);
        out.note = m.compressed_size != m.size
                       ? "a deflated npz member (np.savez_compressed) is inflated into RAM; save it with np.savez or "
                         "np.save to keep it memory-mapped"
                       : "this npz member could not be viewed in place and was read into RAM";
      }
      break;
    }
    case io::Format::kSafetensors: {
      const io::SafetensorsFile st = io::SafetensorsFile::parse(file->data(), file->size(), r.path, file);
      std::vector<std::string> names;
      for (const auto& e : st.entries()) names.push_back(e.name);
      const io::SafetensorsFile::Entry& e = st.entries()[pick(names, r.name, r.path)];
      out.where = r.path + ":" + e.name;
      out.array = st.array(e);
      break;
    }
    default:
      throw bad_input(
          "{}: a {} file; data.dataset = \"arrays\" reads .npy, .npz and .safetensors files (`crucible "
          "convert` writes them){}",
          r.path, io::format_name(format), format == io::Format::kIdx ? "; IDX files are data.dataset = \"idx\"" : "");
  }
  const uint8_t* begin = file->data();
  const uint8_t* end = begin + file->size();
  out.mapped = out.array.data >= begin && out.array.data + out.array.nbytes() <= end;
  if (!out.mapped && out.note.empty()) {
    out.note = "a big-endian array is converted into RAM; save it little-endian to keep it memory-mapped";
  }
  if (!out.array.is_c_contiguous()) {  // Fortran order: samples are not contiguous in the file
    out.array = out.array.contiguous();
    out.mapped = false;
    out.note = "a Fortran-order array is copied into RAM in C order; save it C-contiguous to keep it memory-mapped";
  }
  return out;
}

ArraySource::ArraySource(OpenedArray features, int64_t n, std::vector<int64_t> labels, std::string labels_where,
                         std::vector<float> targets, int64_t target_width)
    : features_(std::move(features)),
      n_(n),
      labels_(std::move(labels)),
      labels_where_(std::move(labels_where)),
      targets_(std::move(targets)),
      target_width_(target_width) {
  const io::Array& a = features_.array;
  const std::vector<int64_t>& s = a.shape;
  const std::string& where = features_.where;
  if (s.empty() || s[0] < 1) {
    throw bad_input("{}: no samples (shape {})", where, a.shape_string());
  }
  if (a.dtype == io::DType::kU8) {
    if (s.size() != 3 && s.size() != 4) {
      throw bad_input(
          "{}: uint8 features are images [n, height, width] or [n, height, width, channels], found shape {}", where,
          a.shape_string());
    }
    spec_.height = s[1];
    spec_.width = s[2];
    spec_.channels = s.size() == 4 ? s[3] : 1;
    if (spec_.channels != 1 && spec_.channels != 3) {
      throw bad_input(
          "{}: uint8 images have 1 or 3 channels, last (channels-last [n, height, width, channels]), found "
          "shape {}{}",
          where, a.shape_string(),
          s.size() == 4 && (s[1] == 1 || s[1] == 3)
              ? ": it looks channels-first; save it as [n, height, width, channels] (x.transpose(0, 2, 3, 1))"
              : "");
    }
    spec_.type = SampleType::kPixels;
    spec_.order = spec_.channels == 1 ? ColorOrder::kGray : ColorOrder::kRGB;
    spec_.range = ValueRange::kByte;
  } else if (is_feature_float(a.dtype)) {
    if (s.size() == 4) {
      spec_.channels = s[1];
      spec_.height = s[2];
      spec_.width = s[3];
    } else if (s.size() == 3) {
      spec_.channels = 1;
      spec_.height = s[1];
      spec_.width = s[2];
    } else if (s.size() == 2) {
      spec_.channels = s[1];
      spec_.height = spec_.width = 1;
    } else {
      throw bad_input(
          "{}: float features are [n, channels, height, width], [n, height, width] or [n, d], found shape {}", where,
          a.shape_string());
    }
    spec_.type = SampleType::kFeatures;
    spec_.order = spec_.channels == 3 ? ColorOrder::kRGB : ColorOrder::kGray;
    spec_.range = ValueRange::kNormalized;  // used as they are
  } else {
    throw bad_input(
        "{}: features must be uint8 images or float32 features (float16, bfloat16 and float64 are "
        "converted), found {} {}",
        where, io::dtype_name(a.dtype), a.shape_string());
  }
  if (spec_.height < 1 || spec_.width < 1 || spec_.channels < 1) {
    throw bad_input("{}: a sample holds no values (shape {})", where, a.shape_string());
  }
  data_ = a.data;
  stored_sample_bytes_ = spec_.height * spec_.width * spec_.channels * static_cast<int64_t>(io::dtype_size(a.dtype));
  if (static_cast<int64_t>(labels_.size()) != n_ || n_ > s[0] ||
      static_cast<int64_t>(targets_.size()) != n_ * target_width_) {
    throw std::logic_error("ArraySource: label count or n does not match the features");
  }
  for (int64_t l : labels_) num_classes_ = std::max(num_classes_, l + 1);
  if (target_width_ > 0) num_classes_ = target_width_;
}

void ArraySource::copy_sample(int64_t i, uint8_t* dst) const {
  const uint8_t* src = pixels(i);
  const int64_t count = spec_.height * spec_.width * spec_.channels;
  switch (features_.array.dtype) {
    case io::DType::kF16:
      for (int64_t k = 0; k < count; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, 2);
        const float f = fp16_ieee_to_fp32_value(h);
        std::memcpy(dst + 4 * k, &f, 4);
      }
      return;
    case io::DType::kBF16:
      for (int64_t k = 0; k < count; ++k) {
        uint32_t bits = 0;
        std::memcpy(reinterpret_cast<uint8_t*>(&bits) + 2, src + 2 * k, 2);  // little-endian: the high half
        std::memcpy(dst + 4 * k, &bits, 4);
      }
      return;
    case io::DType::kF64:
      for (int64_t k = 0; k < count; ++k) {
        double v;
        std::memcpy(&v, src + 8 * k, 8);
        const float f = static_cast<float>(v);
        std::memcpy(dst + 4 * k, &f, 4);
      }
      return;
    default:  // uint8 pixels, float32 features: the stored bytes
      std::memcpy(dst, src, static_cast<size_t>(stored_sample_bytes_));
  }
}

std::string ArraySource::describe() const {
  return fmt::format("{} ({} {}{}{}) + {}", features_.where, io::dtype_name(features_.array.dtype),
                     features_.array.shape_string(), n_ < features_.array.shape[0] ? fmt::format(", first {}", n_) : "",
                     features_.mapped ? ", memory-mapped" : ", in RAM", labels_where_);
}

ArraySource::ValueReport ArraySource::value_report(int64_t max_samples) const {
  const int64_t k = std::min(n_, std::max<int64_t>(max_samples, 1));
  io::Array view = features_.array;  // C-contiguous (open_array made it so): the first k samples
  view.shape[0] = k;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  int64_t non_finite = 0;
  bool whole = true;
  io::for_each_double(view, features_.where, [&](int64_t, double v) {
    if (!std::isfinite(v)) {
      ++non_finite;
      return;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    whole = whole && v == std::floor(v);
  });
  ValueReport r;
  const std::string range =
      non_finite == view.numel() ? std::string("no finite values") : fmt::format("min {:g}, max {:g}", lo, hi);
  const bool pixels = spec_.type == SampleType::kPixels;
  r.info = fmt::format("{}: {} {} ({} used, {}), values in the first {} samples: {}; {}", features_.where,
                       io::dtype_name(features_.array.dtype), features_.array.shape_string(), n_,
                       features_.mapped ? "memory-mapped (D13)" : "in RAM: " + features_.note, k, range,
                       pixels ? "uint8 pixels, normalised on the device as images with data.mean/data.std"
                              : fmt::format("float features, used as they are ({}float32 [channels, height, width] "
                                            "= [{}, {}, {}]; no data.mean/data.std, no flip)",
                                            features_.array.dtype == io::DType::kF32 ? "" : "converted to ",
                                            spec_.channels, spec_.height, spec_.width));
  if (pixels) return r;
  if (non_finite > 0) {
    r.warning = fmt::format(
        "{}: {} NaN/Inf value(s) in the first {} samples; float features are used as they are, so "
        "they reach the model (D4)",
        features_.where, non_finite, k);
  } else if (hi > 20 || lo < -20 || (lo >= 0 && hi > 1.5 && whole)) {
    r.warning = fmt::format(
        "{}: float features are used as they are (no data.mean/data.std), but the first {} samples "
        "hold values from {:g} to {:g}{}: they look un-normalised{}. Normalise them before saving "
        "(e.g. (x/255 - mean)/std), or save uint8 pixels [n, height, width(, channels)] so crucible "
        "normalises them with data.mean/data.std (D4)",
        features_.where, k, lo, hi, whole ? ", all whole numbers" : "",
        lo >= 0 && hi <= 255 && whole ? " (0-255 pixel values?)" : "");
  }
  return r;
}

std::unique_ptr<ArraySource> load_array_source(const std::string& features, const std::string& labels, int64_t limit,
                                               const std::string& limit_name) {
  OpenedArray x = open_array(features);
  OpenedArray y = open_array(labels);
  const bool multi = y.array.shape.size() == 2;
  if (!multi && (!is_integer_dtype(y.array.dtype) || y.array.shape.size() != 1)) {
    throw bad_input("{}: labels must be integer class indices of shape [n] (int64, int32, uint8, …), or multi-label "
                    "targets of shape [n, classes] (0/1 or 0–1), found {} {}",
                    y.where, io::dtype_name(y.array.dtype), y.array.shape_string());
  }
  const int64_t n_x = x.array.shape.empty() ? 0 : x.array.shape[0];
  const int64_t n_y = y.array.shape[0];
  if (n_x != n_y) {
    throw bad_input("{} holds {} samples but {} holds {} labels: the counts must match", x.where, n_x, y.where, n_y);
  }
  if (limit > n_x) {
    throw bad_input("{} = {} but {} holds {} samples: ask for at most {}, or 0 for all", limit_name, limit, x.where,
                    n_x, n_x);
  }
  const int64_t n = limit > 0 ? limit : n_x;
  std::string where = y.where;
  if (multi) {
    std::vector<float> t = read_targets(y, n);
    const int64_t w = y.array.shape[1];
    return std::make_unique<ArraySource>(std::move(x), n, std::vector<int64_t>(static_cast<size_t>(n), -1),
                                         std::move(where), std::move(t), w);
  }
  int64_t classes = 0;
  std::vector<int64_t> l = read_labels(y, n, &classes);
  return std::make_unique<ArraySource>(std::move(x), n, std::move(l), std::move(where));
}

}  // namespace crucible::data
