// PyTorch .pt reader: libzip lists torch.save's zip members; a restricted unpickler (by hand:
// no Debian package parses a pickle without executing it) builds containers, storages and
// tensors in flat arenas; a depth-capped walk flattens them into named views of the storages.
#include "crucible/io/pt.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/core/mmap.h"
#include "zip_archive.h"

namespace crucible::io {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "storage byte swapping assumes a little-endian host");

constexpr size_t kMaxDepth = 1000;           // containers nested deeper than this are refused
constexpr size_t kShownChars = 60;           // string values in `skipped` are cut here
constexpr size_t kMaxDims = 64;              // tensor dimensions (far above what torch's kernels take)


// RFC 3629 well-formed UTF-8 (Python's pickle refuses anything else in BINUNICODE).
bool valid_utf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (n - i < len) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return false;
    }
    i += len;
  }
  return true;
}

// Python's repr of a float: shortest round-trip digits, with ".0" on integral values.
std::string python_float(double d) {
  std::string s = fmt::format("{}", d);
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

// ---------------------------------------------------------------------------------------------
// Pickle values. Containers live in arenas and refer to each other by index, so shared and
// even cyclic structures (which a crafted pickle can build) need no reference counting and
// free without recursion.

enum class Kind : uint8_t {
  kEmpty,  // an unset memo slot
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kBytes,
  kList,
  kTuple,
  kDict,
  kGlobal,
  kStorage,
  kTensor,
};

struct Value {
  Kind kind = Kind::kNone;
  int64_t i = 0;  // bool, int; arena index for str, bytes, list, tuple, dict, storage, tensor; global id
  double f = 0;   // float
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kEmpty:
      return "nothing";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "class or function";
    case Kind::kStorage:
      return "storage";
    case Kind::kTensor:
      return "tensor";
  }
  return "?";
}

// The only globals a file may name (torch.load(weights_only=True) in spirit, narrower).
enum class Callable : uint8_t { kOrderedDict, kRebuildTensorV2, kRebuildParameter, kSize, kStorageType };

struct Global {
  const char* module;
  const char* name;
  Callable callable;
  DType dtype;  // for storage types
};

constexpr Global kGlobals[] = {
    {"collections", "OrderedDict", Callable::kOrderedDict, DType::kF32},
    {"torch._utils", "_rebuild_tensor_v2", Callable::kRebuildTensorV2, DType::kF32},
    {"torch._utils", "_rebuild_parameter", Callable::kRebuildParameter, DType::kF32},
    {"torch", "Size", Callable::kSize, DType::kF32},
    {"torch", "FloatStorage", Callable::kStorageType, DType::kF32},
    {"torch", "DoubleStorage", Callable::kStorageType, DType::kF64},
    {"torch", "HalfStorage", Callable::kStorageType, DType::kF16},
    {"torch", "BFloat16Storage", Callable::kStorageType, DType::kBF16},
    {"torch", "LongStorage", Callable::kStorageType, DType::kI64},
    {"torch", "IntStorage", Callable::kStorageType, DType::kI32},
    {"torch", "ShortStorage", Callable::kStorageType, DType::kI16},
    {"torch", "CharStorage", Callable::kStorageType, DType::kI8},
    {"torch", "ByteStorage", Callable::kStorageType, DType::kU8},
    {"torch", "BoolStorage", Callable::kStorageType, DType::kBool},
    {"torch", "ComplexFloatStorage", Callable::kStorageType, DType::kC64},
    {"torch", "ComplexDoubleStorage", Callable::kStorageType, DType::kC128},
};

std::string global_name(int64_t id) {
  const Global& g = kGlobals[static_cast<size_t>(id)];
  return std::string(g.module) + "." + g.name;
}

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // in insertion order; keys are scalars
  bool ordered = false;                        // an OrderedDict (accepts BUILD)
};

struct Storage {
  std::string key;
  DType dtype = DType::kF32;
  uint64_t numel = 0;
  const uint8_t* data = nullptr;
  std::shared_ptr<const void> owner;  // null: the input's owner holds the bytes
};

// A validated _rebuild_tensor_v2 call. Size and stride stay references to their (immutable)
// tuples, so a crafted pickle that rebuilds many tensors from one tuple costs no copies.
struct Tensor {
  size_t storage = 0;
  int64_t offset = 0;
  size_t shape = 0, strides = 0;  // indices of tuples of non-negative ints in Heap::seqs
};

struct Heap {
  std::vector<std::string> strings;      // str and bytes
  std::vector<std::vector<Value>> seqs;  // lists and tuples
  std::vector<Dict> dicts;
  std::vector<Storage> storages;
  std::vector<Tensor> tensors;
};

// Names the opcodes this reader refuses, for the message.
const char* refused_opcode_name(uint8_t op) {
  switch (op) {
    case '2':
      return "DUP";
    case 'F':
      return "FLOAT";
    case 'I':
      return "INT";
    case 'L':
      return "LONG";
    case 'P':
      return "PERSID";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'd':
      return "DICT";
    case 'g':
      return "GET";
    case 'i':
      return "INST";
    case 'l':
      return "LIST";
    case 'o':
      return "OBJ";
    case 'p':
      return "PUT";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 0x8b:
      return "LONG4";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------------------------------------
// The reader: archive layout, storages, the unpickler and the flattening walk.

class PtReader {
 public:
  PtReader(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner)
      : data_(data), size_(size), name_(name), owner_(std::move(owner)) {}

  PtContents read() {
    open_archive();
    std::vector<uint8_t> pickle = archive_.read(static_cast<zip_uint64_t>(pkl_index_));
    Value root = unpickle(pickle.data(), pickle.size());
    return flatten(root, pickle.size());
  }

 private:
  // --- archive -----------------------------------------------------------------------------

  void open_archive() {
    if (size_ == 0) throw bad_input("{}: empty file; expected a torch.save zip archive", name_);
    std::string why;
    if (!archive_.open(data_, size_, name_, &why)) {
      if (size_ >= 2 && data_[0] == 0x80 && data_[1] == 0x02) {
        throw bad_input(
            "{}: the legacy torch.save format (PyTorch before 1.6, or _use_new_zipfile_serialization="
            "False), not a zip archive: re-save it with torch.save(obj, path) on a current torch",
            name_);
      }
      if (size_ >= 2 && data_[0] == 'P' && data_[1] == 'K') {
        throw bad_input("{}: corrupt or truncated zip archive ({}); expected a complete torch.save file", name_, why);
      }
      std::string head;
      for (size_t i = 0; i < std::min<size_t>(size_, 4); ++i) head += fmt::format(" {:02x}", data_[i]);
      throw bad_input("{}: not a torch.save file: expected a zip archive starting with 'PK' (50 4b), found{}", name_,
                      head);
    }
    for (const std::string& m : archive_.names()) {
      // torch.jit.save writes <stem>/constants.pkl and <stem>/code/; torch.save never does (a
      // torch.save file named code.pt holds code/data.pkl, which is fine).
      const size_t slash = m.find('/');
      if (slash == std::string::npos) continue;
      if (m.compare(slash + 1, std::string::npos, "constants.pkl") == 0 || m.compare(slash + 1, 5, "code/") == 0) {
        throw bad_input(
            "{}: a TorchScript archive (torch.jit.save; it holds '{}'), not a state_dict: in Python, "
            "torch.save(torch.jit.load(path).state_dict(), new_path)",
            name_, shown(m));
      }
    }
    std::vector<std::string> pkls;
    for (const std::string& m : archive_.names()) {
      if (m.size() > 9 && m.compare(m.size() - 9, 9, "/data.pkl") == 0) pkls.push_back(m);
    }
    if (pkls.empty()) {
      std::string listed;
      for (size_t i = 0; i < archive_.names().size() && i < 5; ++i)
        listed += (i ? ", '" : "'") + shown(archive_.names()[i]) + "'";
      if (archive_.names().size() > 5) listed += ", ...";
      throw bad_input("{}: a zip archive without a '<name>/data.pkl' member, so not a torch.save file (members: {})",
                      name_, listed.empty() ? "none" : listed);
    }
    if (pkls.size() > 1) {
      throw bad_input("{}: {} members named '<name>/data.pkl' ('{}', '{}'); a torch.save file has one", name_,
                      pkls.size(), shown(pkls[0]), shown(pkls[1]));
    }
    pkl_member_ = pkls[0];
    prefix_ = pkl_member_.substr(0, pkl_member_.size() - 8);  // "<stem>/"
    pkl_index_ = archive_.find(pkl_member_);
    const int64_t order = archive_.find(prefix_ + "byteorder");
    if (order >= 0) {
      const std::vector<uint8_t> b = archive_.read(static_cast<zip_uint64_t>(order));
      const std::string s(b.begin(), b.end());
      if (s == "big") {
        big_endian_ = true;
      } else if (s != "little") {
        throw bad_input("{}: zip member '{}byteorder': expected 'little' or 'big', found '{}'", name_, shown(prefix_),
                        shown(s));
      }
    }
  }

  // Resolves a persistent id ('storage', type, key, location, numel) to a storage index. One
  // storage per (key, type, numel) and one byte buffer per (key, type): tensors that share a
  // storage share bytes, and a copy (big-endian or misaligned member) is made at most once per
  // type, so repeated ids cost no memory.
  size_t storage(DType dtype, const std::string& key, const std::string& location, int64_t numel) {
    if (location != "cpu" && locations_.size() < 8) locations_.insert(shown(location));
    const auto id = std::make_tuple(key, dtype, numel);
    auto found = storage_index_.find(id);
    if (found != storage_index_.end()) return found->second;
    const std::string member = prefix_ + "data/" + key;
    auto mb = member_bytes_.find(key);
    if (mb == member_bytes_.end()) {
      const int64_t index = archive_.find(member);
      if (index < 0) fail(fmt::format("storage '{}' has no zip member '{}'", shown(key), shown(member)));
      mb = member_bytes_.emplace(key, archive_.bytes(static_cast<zip_uint64_t>(index))).first;
    }
    const MemberBytes& bytes = mb->second;
    const int64_t dims[1] = {numel};
    const uint64_t nbytes = checked_nbytes(dims, 1, dtype, fmt::format("{}: storage '{}'", name_, shown(key)));
    if (nbytes > bytes.size) {
      fail(fmt::format("storage '{}' declares {} {} elements ({} bytes), but zip member '{}' holds {} bytes",
                       shown(key), numel, dtype_name(dtype), nbytes, shown(member), bytes.size));
    }
    auto typed = typed_bytes_.find(std::make_pair(key, dtype));
    if (typed == typed_bytes_.end()) {
      MemberBytes t = bytes;
      const size_t item = dtype_size(dtype);
      const size_t align = dtype_is_complex(dtype) ? item / 2 : item;
      if ((big_endian_ && item > 1) || reinterpret_cast<uintptr_t>(t.data) % align != 0) {  // a private copy
        const uint64_t count = bytes.size / item;
        auto copy = std::make_shared<std::vector<uint8_t>>(bytes.data, bytes.data + count * item);
        if (big_endian_) byteswap(copy->data(), count, dtype);
        t.data = copy->data();
        t.owner = copy;
      }
      typed = typed_bytes_.emplace(std::make_pair(key, dtype), t).first;
    }
    Storage s;
    s.key = key;
    s.dtype = dtype;
    s.numel = static_cast<uint64_t>(numel);
    s.data = typed->second.data;
    s.owner = typed->second.owner;
    heap_.storages.push_back(std::move(s));
    storage_index_.emplace(id, heap_.storages.size() - 1);
    return heap_.storages.size() - 1;
  }

  // --- unpickler -----------------------------------------------------------------------------

  [[noreturn]] void fail(const std::string& what) const {
    throw bad_input("{}: {} byte {}: {}", name_, shown(pkl_member_), op_pos_, what);
  }

  void need(size_t n) {
    if (n_ - pos_ < n) {
      fail(fmt::format("the pickle ends {} bytes into an argument that needs {} (truncated data.pkl?)", n_ - pos_, n));
    }
  }
  uint8_t u8() {
    need(1);
    return p_[pos_++];
  }
  uint64_t le(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= uint64_t{p_[pos_ + k]} << (8 * k);
    pos_ += n;
    return v;
  }
  // A length field, checked against the bytes left before anything is allocated.
  size_t length(size_t field_bytes) {
    const uint64_t n = le(field_bytes);
    if (n > n_ - pos_) fail(fmt::format("a length of {} bytes, but only {} bytes of pickle remain", n, n_ - pos_));
    return static_cast<size_t>(n);
  }
  std::string line() {
    const uint8_t* start = p_ + pos_;
    const void* nl = std::memchr(start, '\n', n_ - pos_);
    if (nl == nullptr) fail("GLOBAL's name has no terminating newline (truncated data.pkl?)");
    const size_t len = static_cast<size_t>(static_cast<const uint8_t*>(nl) - start);
    pos_ += len + 1;
    return std::string(reinterpret_cast<const char*>(start), len);
  }

  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  Value pop() {
    if (stack_.size() <= base()) fail("the pickle pops a value from an empty stack");
    Value v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value& top() {
    if (stack_.size() <= base()) fail("the pickle reads a value from an empty stack");
    return stack_.back();
  }
  std::vector<Value> pop_mark() {
    if (marks_.empty()) fail("the pickle closes a MARK it never opened");
    std::vector<Value> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }

  Value new_seq(Kind kind, std::vector<Value> items) {
    heap_.seqs.push_back(std::move(items));
    return Value{kind, static_cast<int64_t>(heap_.seqs.size() - 1), 0};
  }
  Value new_dict(bool ordered) {
    heap_.dicts.emplace_back();
    heap_.dicts.back().ordered = ordered;
    return Value{Kind::kDict, static_cast<int64_t>(heap_.dicts.size() - 1), 0};
  }
  Value new_string(Kind kind, size_t len) {
    if (kind == Kind::kStr && !valid_utf8(p_ + pos_, len)) fail("a string that is not valid UTF-8");
    heap_.strings.emplace_back(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return Value{kind, static_cast<int64_t>(heap_.strings.size() - 1), 0};
  }
  const std::string& str(const Value& v) const { return heap_.strings[static_cast<size_t>(v.i)]; }
  const std::vector<Value>& seq(const Value& v) const { return heap_.seqs[static_cast<size_t>(v.i)]; }

  void memo_put(uint64_t index) {
    // A pickler numbers memo entries from 0, one per memoised value, so an index is below the
    // pickle's length; anything larger is refused rather than allocated.
    if (index >= n_) fail(fmt::format("memo index {} is beyond what a {}-byte pickle can hold", index, n_));
    if (index >= memo_.size()) memo_.resize(static_cast<size_t>(index) + 1, Value{Kind::kEmpty, 0, 0});
    if (memo_[index].kind == Kind::kEmpty) ++memo_count_;
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    if (index >= memo_.size() || memo_[index].kind == Kind::kEmpty)
      fail(fmt::format("memo index {} was never set", index));
    stack_.push_back(memo_[index]);
  }

  Value global(const std::string& module, const std::string& name) {
    for (size_t k = 0; k < sizeof kGlobals / sizeof kGlobals[0]; ++k) {
      if (module == kGlobals[k].module && name == kGlobals[k].name)
        return Value{Kind::kGlobal, static_cast<int64_t>(k), 0};
    }
    throw bad_input(
        "{}: refused global '{}.{}' at pickle byte {}: only state_dict contents (tensors, containers, numbers, "
        "strings) are loaded",
        name_, shown(module), shown(name), op_pos_);
  }

  int64_t int_arg(const Value& v, const char* what) const {
    if (v.kind != Kind::kInt && v.kind != Kind::kBool)
      fail(fmt::format("{} must be an int, found a {}", what, kind_name(v.kind)));
    return v.i;
  }
  // A tensor's size or stride: a tuple of at most kMaxDims non-negative ints.
  std::vector<int64_t> dims_arg(const Value& v, const char* what) const {
    if (v.kind != Kind::kTuple) fail(fmt::format("{} must be a tuple of ints, found a {}", what, kind_name(v.kind)));
    const std::vector<Value>& items = seq(v);
    if (items.size() > kMaxDims)
      fail(fmt::format("{} has {} dimensions; at most {} are supported", what, items.size(), kMaxDims));
    std::vector<int64_t> out;
    for (const Value& e : items) {
      const int64_t x = int_arg(e, what);
      if (x < 0) fail(fmt::format("{} holds {}; expected non-negative ints", what, x));
      out.push_back(x);
    }
    return out;
  }
  std::vector<int64_t> dims(size_t seq_index) const {
    std::vector<int64_t> out;
    for (const Value& e : heap_.seqs[seq_index]) out.push_back(e.i);
    return out;
  }

  // torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  // backward_hooks[, metadata]): a view of the storage, checked to lie inside it.
  Value rebuild_tensor(const std::vector<Value>& args) {
    if (args.size() != 6 && args.size() != 7) {
      fail(fmt::format("_rebuild_tensor_v2 takes 6 or 7 arguments, found {}", args.size()));
    }
    if (args[0].kind != Kind::kStorage)
      fail(fmt::format("_rebuild_tensor_v2 expects a storage first, found a {}", kind_name(args[0].kind)));
    Tensor t;
    t.storage = static_cast<size_t>(args[0].i);
    t.offset = int_arg(args[1], "the storage offset");
    if (t.offset < 0) fail(fmt::format("storage offset {}; expected a non-negative int", t.offset));
    const std::vector<int64_t> shape = dims_arg(args[2], "the tensor size");
    const std::vector<int64_t> strides = dims_arg(args[3], "the tensor stride");
    t.shape = static_cast<size_t>(args[2].i);
    t.strides = static_cast<size_t>(args[3].i);
    if (shape.size() != strides.size()) {
      fail(fmt::format("a tensor with {} sizes but {} strides", shape.size(), strides.size()));
    }
    int64_t product = 1;  // of the sizes, zeros counted as ones: Array's layout helpers need it
    for (int64_t d : shape) {
      if (__builtin_mul_overflow(product, std::max<int64_t>(d, 1), &product)) {
        fail(fmt::format("a tensor of size [{}] has more elements than 64 bits count", fmt::join(shape, ", ")));
      }
    }
    const Storage& s = heap_.storages[t.storage];
    const uint64_t nbytes = checked_nbytes(shape.data(), shape.size(), s.dtype,
                                           fmt::format("{}: {} byte {}: tensor", name_, shown(pkl_member_), op_pos_));
    if (nbytes > 0) {
      // The last element sits at offset + sum((size - 1) * stride); it must lie in the storage.
      uint64_t last = static_cast<uint64_t>(t.offset);
      bool overflow = false;
      for (size_t d = 0; d < shape.size(); ++d) {
        uint64_t step = 0;
        overflow |=
            __builtin_mul_overflow(static_cast<uint64_t>(shape[d] - 1), static_cast<uint64_t>(strides[d]), &step);
        overflow |= __builtin_add_overflow(last, step, &last);
      }
      if (overflow || last >= s.numel) {
        fail(fmt::format("a tensor of size [{}], stride [{}], offset {} reaches past the {} elements of storage '{}'",
                         fmt::join(shape, ", "), fmt::join(strides, ", "), t.offset, s.numel, shown(s.key)));
      }
    }
    heap_.tensors.push_back(t);
    return Value{Kind::kTensor, static_cast<int64_t>(heap_.tensors.size() - 1), 0};
  }

  // REDUCE and NEWOBJ: calls one of the allowed globals on `args`.
  Value call(const Value& fn, const Value& args_value, const char* opcode) {
    if (fn.kind != Kind::kGlobal)
      fail(fmt::format("{} calls a {}; expected an allowed class or function", opcode, kind_name(fn.kind)));
    if (args_value.kind != Kind::kTuple)
      fail(fmt::format("{} arguments must be a tuple, found a {}", opcode, kind_name(args_value.kind)));
    const std::vector<Value>& args = seq(args_value);  // stays valid: no call adds a seq before reading args
    const Callable c = kGlobals[static_cast<size_t>(fn.i)].callable;
    const bool newobj = std::strcmp(opcode, "NEWOBJ") == 0;
    if (newobj && c != Callable::kOrderedDict && c != Callable::kSize) {
      fail(fmt::format("NEWOBJ of {} is not supported", global_name(fn.i)));
    }
    switch (c) {
      case Callable::kOrderedDict:  // torch pickles OrderedDict() and fills it with SETITEMS
        if (!args.empty()) fail(fmt::format("OrderedDict called with {} arguments; expected none", args.size()));
        return new_dict(true);
      case Callable::kSize:  // torch.Size((2, 3)) is the tuple itself (tuples are immutable)
        if (args.empty()) return new_seq(Kind::kTuple, {});
        if (args.size() == 1 && args[0].kind == Kind::kTuple) {
          for (const Value& d : seq(args[0])) int_arg(d, "a torch.Size entry");
          return args[0];
        }
        fail("torch.Size expects one tuple of ints");
      case Callable::kRebuildTensorV2:
        return rebuild_tensor(args);
      case Callable::kRebuildParameter:
        if (args.size() != 3 || args[0].kind != Kind::kTensor) {
          fail("_rebuild_parameter expects (tensor, requires_grad, backward_hooks)");
        }
        return args[0];
      case Callable::kStorageType:
        fail(fmt::format("{} is only accepted inside a storage's persistent id, not called", global_name(fn.i)));
    }
    fail("unreachable");
  }

  void set_item(const Value& dict, const Value& key, const Value& value) {
    switch (key.kind) {
      case Kind::kNone:
      case Kind::kBool:
      case Kind::kInt:
      case Kind::kFloat:
      case Kind::kStr:
      case Kind::kBytes:
        break;
      default:
        fail(
            fmt::format("a dict key that is a {}; expected str, int, float, bool, bytes or None", kind_name(key.kind)));
    }
    heap_.dicts[static_cast<size_t>(dict.i)].items.emplace_back(key, value);
  }
  Value& dict_top(const char* opcode) {
    Value& d = top();
    if (d.kind != Kind::kDict) fail(fmt::format("{} on a {}; expected a dict", opcode, kind_name(d.kind)));
    return d;
  }
  Value& list_top(const char* opcode) {
    Value& l = top();
    if (l.kind != Kind::kList) fail(fmt::format("{} on a {}; expected a list", opcode, kind_name(l.kind)));
    return l;
  }

  Value persistent_load(const Value& pid) {
    if (pid.kind != Kind::kTuple || seq(pid).size() != 5) {
      fail("BINPERSID expects a ('storage', type, key, location, numel) tuple");
    }
    const std::vector<Value>& t = seq(pid);
    if (t[0].kind != Kind::kStr || str(t[0]) != "storage") fail("a persistent id that is not a ('storage', ...) tuple");
    if (t[1].kind != Kind::kGlobal || kGlobals[static_cast<size_t>(t[1].i)].callable != Callable::kStorageType) {
      fail(fmt::format("a storage whose type is a {}; expected torch.FloatStorage or another storage class",
                       kind_name(t[1].kind)));
    }
    if (t[2].kind != Kind::kStr) fail(fmt::format("a storage key that is a {}; expected a str", kind_name(t[2].kind)));
    if (t[3].kind != Kind::kStr)
      fail(fmt::format("a storage location that is a {}; expected a str", kind_name(t[3].kind)));
    const int64_t numel = int_arg(t[4], "the storage's element count");
    if (numel < 0) fail(fmt::format("a storage of {} elements", numel));
    const size_t s = storage(kGlobals[static_cast<size_t>(t[1].i)].dtype, str(t[2]), str(t[3]), numel);
    return Value{Kind::kStorage, static_cast<int64_t>(s), 0};
  }

  // Runs the pickle to STOP and returns the object it built. Iterative: the input cannot
  // deepen the C++ stack.
  Value unpickle(const uint8_t* p, size_t n) {
    p_ = p;
    n_ = n;
    pos_ = 0;
    while (true) {
      op_pos_ = pos_;
      if (pos_ >= n_) fail("the pickle ends without STOP (truncated data.pkl?)");
      const uint8_t op = p_[pos_++];
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t v = u8();
          if (v < 2 || v > 5) fail(fmt::format("pickle protocol {}; expected 2 to 5", v));
          break;
        }
        case 0x95: {  // FRAME: framing only groups opcodes; the length is checked and ignored
          const uint64_t len = le(8);
          if (len > n_ - pos_) fail(fmt::format("a frame of {} bytes, but only {} remain", len, n_ - pos_));
          break;
        }
        case '.': {  // STOP
          if (!marks_.empty()) fail("STOP inside an unclosed MARK");
          return pop();
        }
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case '0':  // POP (CPython emits it for recursive tuples)
          pop();
          break;
        case '1':  // POP_MARK
          pop_mark();
          break;
        case '}':  // EMPTY_DICT
          stack_.push_back(new_dict(false));
          break;
        case ']':  // EMPTY_LIST
          stack_.push_back(new_seq(Kind::kList, {}));
          break;
        case ')':  // EMPTY_TUPLE
          stack_.push_back(new_seq(Kind::kTuple, {}));
          break;
        case 't':  // TUPLE
          stack_.push_back(new_seq(Kind::kTuple, pop_mark()));
          break;
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          std::vector<Value> items(static_cast<size_t>(op - 0x84));
          for (size_t k = items.size(); k-- > 0;) items[k] = pop();
          stack_.push_back(new_seq(Kind::kTuple, std::move(items)));
          break;
        }
        case 'J':  // BININT
          stack_.push_back(Value{Kind::kInt, static_cast<int32_t>(static_cast<uint32_t>(le(4))), 0});
          break;
        case 'K':  // BININT1
          stack_.push_back(Value{Kind::kInt, static_cast<int64_t>(le(1)), 0});
          break;
        case 'M':  // BININT2
          stack_.push_back(Value{Kind::kInt, static_cast<int64_t>(le(2)), 0});
          break;
        case 0x8a: {  // LONG1: n bytes, little-endian two's complement
          const uint8_t len = u8();
          if (len > 8) fail(fmt::format("an integer of {} bytes; at most 64 bits are supported", len));
          uint64_t v = le(len);
          if (len > 0 && len < 8 && (v >> (8 * len - 1)) & 1) v |= ~uint64_t{0} << (8 * len);
          stack_.push_back(Value{Kind::kInt, static_cast<int64_t>(v), 0});
          break;
        }
        case 'G': {  // BINFLOAT: big-endian double
          need(8);
          uint64_t bits = 0;
          for (size_t k = 0; k < 8; ++k) bits = (bits << 8) | p_[pos_ + k];
          pos_ += 8;
          double d;
          std::memcpy(&d, &bits, 8);
          stack_.push_back(Value{Kind::kFloat, 0, d});
          break;
        }
        case 0x88:  // NEWTRUE
          stack_.push_back(Value{Kind::kBool, 1, 0});
          break;
        case 0x89:  // NEWFALSE
          stack_.push_back(Value{Kind::kBool, 0, 0});
          break;
        case 'N':  // NONE
          stack_.push_back(Value{Kind::kNone, 0, 0});
          break;
        case 'X':  // BINUNICODE
          stack_.push_back(new_string(Kind::kStr, length(4)));
          break;
        case 0x8c:  // SHORT_BINUNICODE
          stack_.push_back(new_string(Kind::kStr, length(1)));
          break;
        case 0x8d:  // BINUNICODE8
          stack_.push_back(new_string(Kind::kStr, length(8)));
          break;
        case 'B':  // BINBYTES
          stack_.push_back(new_string(Kind::kBytes, length(4)));
          break;
        case 'C':  // SHORT_BINBYTES
          stack_.push_back(new_string(Kind::kBytes, length(1)));
          break;
        case 0x8e:  // BINBYTES8
          stack_.push_back(new_string(Kind::kBytes, length(8)));
          break;
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line();
          const std::string name = line();
          stack_.push_back(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const Value name = pop();
          const Value module = pop();
          if (module.kind != Kind::kStr || name.kind != Kind::kStr) fail("STACK_GLOBAL expects two strings");
          stack_.push_back(global(str(module), str(name)));
          break;
        }
        case 'R': {  // REDUCE
          const Value args = pop();
          const Value fn = pop();
          stack_.push_back(call(fn, args, "REDUCE"));
          break;
        }
        case 0x81: {  // NEWOBJ
          const Value args = pop();
          const Value cls = pop();
          stack_.push_back(call(cls, args, "NEWOBJ"));
          break;
        }
        case 'b': {  // BUILD: only an OrderedDict's attributes (state_dict's _metadata), ignored
          const Value state = pop();
          const Value& obj = top();
          if (obj.kind != Kind::kDict || !heap_.dicts[static_cast<size_t>(obj.i)].ordered) {
            fail(fmt::format("BUILD sets the state of a {}; only an OrderedDict's (ignored) is accepted",
                             kind_name(obj.kind)));
          }
          if (state.kind != Kind::kDict && state.kind != Kind::kTuple && state.kind != Kind::kNone) {
            fail(fmt::format("BUILD with a {} state; expected a dict, tuple or None", kind_name(state.kind)));
          }
          break;
        }
        case 'q':  // BINPUT
          memo_put(le(1));
          break;
        case 'r':  // LONG_BINPUT
          memo_put(le(4));
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_count_);
          break;
        case 'h':  // BINGET
          memo_get(le(1));
          break;
        case 'j':  // LONG_BINGET
          memo_get(le(4));
          break;
        case 's': {  // SETITEM
          const Value value = pop();
          const Value key = pop();
          set_item(dict_top("SETITEM"), key, value);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Value> items = pop_mark();
          if (items.size() % 2 != 0)
            fail(fmt::format("SETITEMS with {} values; expected key, value pairs", items.size()));
          const Value d = dict_top("SETITEMS");
          for (size_t k = 0; k < items.size(); k += 2) set_item(d, items[k], items[k + 1]);
          break;
        }
        case 'a': {  // APPEND
          const Value v = pop();
          heap_.seqs[static_cast<size_t>(list_top("APPEND").i)].push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Value> items = pop_mark();
          auto& l = heap_.seqs[static_cast<size_t>(list_top("APPENDS").i)];
          l.insert(l.end(), items.begin(), items.end());
          break;
        }
        case 'Q': {  // BINPERSID
          const Value pid = pop();
          stack_.push_back(persistent_load(pid));
          break;
        }
        default: {
          const char* known = refused_opcode_name(op);
          if (known != nullptr) {
            fail(
                fmt::format("unsupported pickle opcode {} (0x{:02x}); a torch.save state_dict needs only protocol 2-5 "
                            "container, number, string, global and persistent-id opcodes",
                            known, op));
          }
          fail(fmt::format("unknown pickle opcode 0x{:02x}; expected a protocol 2-5 opcode", op));
        }
      }
    }
  }

  // --- flattening ----------------------------------------------------------------------------

  [[noreturn]] void fail_at(const std::string& path, const std::string& what) const {
    throw bad_input("{}: '{}': {}", name_, shown(path), what);
  }

  // A dict key as a name part: str as is, int in decimal, the rest as Python prints them.
  std::string key_text(const Value& k) const {
    switch (k.kind) {
      case Kind::kStr:
        return str(k);
      case Kind::kInt:
        return std::to_string(k.i);
      case Kind::kBool:
        return k.i ? "True" : "False";
      case Kind::kNone:
        return "None";
      case Kind::kFloat:
        return python_float(k.f);
      case Kind::kBytes:
        return "b'" + shown(str(k), str(k).size()) + "'";
      default:
        return "?";  // set_item admits only the kinds above
    }
  }

  void count_visit(const std::string& path) {
    if (++visits_ > visit_budget_) {
      fail_at(path.substr(0, 200), fmt::format("the pickle expands to more than {} values (shared containers "
                                               "referenced many times?)",
                                               visit_budget_));
    }
  }
  void count_bytes(size_t n, const std::string& path) {
    name_bytes_ += n;
    if (name_bytes_ > name_budget_)
      fail_at(path.substr(0, 200), fmt::format("the flattened names exceed {} bytes (deep nesting or shared "
                                               "containers referenced many times?)",
                                               name_budget_));
  }

  void skip(const std::string& path, const std::string& what) {
    count_bytes(path.size() + what.size(), path);
    out_.skipped.push_back(path + ": " + what);
  }

  std::string child(const std::string& path, const std::string& part) {
    count_bytes(path.size() + 1 + part.size(), path);
    return path.empty() ? part : path + "." + part;
  }

  void walk(const Value& v, const std::string& path, size_t depth) {
    if (depth > kMaxDepth)
      fail_at(path.substr(0, 200), fmt::format("containers nested deeper than {} levels", kMaxDepth));
    count_visit(path);
    switch (v.kind) {
      case Kind::kTensor: {
        const Tensor& t = heap_.tensors[static_cast<size_t>(v.i)];
        const Storage& s = heap_.storages[t.storage];
        if (!tensor_names_.insert(path).second) fail_at(path, "two tensors flatten to this name");
        NamedArray a;
        a.name = path;
        a.array.dtype = s.dtype;
        a.array.shape = dims(t.shape);
        a.array.strides = dims(t.strides);
        count_bytes(a.name.size() + 16 * a.array.shape.size() + sizeof(NamedArray), path);
        const bool empty = std::find(a.array.shape.begin(), a.array.shape.end(), 0) != a.array.shape.end();
        a.array.data = empty ? s.data : s.data + static_cast<uint64_t>(t.offset) * dtype_size(s.dtype);
        a.array.owner = s.owner != nullptr ? s.owner : owner_;
        out_.tensors.push_back(std::move(a));
        return;
      }
      case Kind::kDict: {
        const size_t index = static_cast<size_t>(v.i);
        const Dict& d = heap_.dicts[index];
        if (d.items.empty()) return skip(path, "dict {}");
        if (on_path_dicts_.count(index)) fail_at(path, "a dict that contains itself");
        on_path_dicts_.insert(index);
        // X4: a dict whose tensors all sit under "module." was saved from a DDP/DP wrapper.
        static const std::string kPrefix = "module.";
        size_t tensors = 0, prefixed = 0;
        for (const auto& kv : d.items) {
          if (kv.second.kind != Kind::kTensor) continue;
          ++tensors;
          if (kv.first.kind == Kind::kStr && str(kv.first).compare(0, kPrefix.size(), kPrefix) == 0) ++prefixed;
        }
        const bool strip = tensors > 0 && prefixed == tensors;
        for (const auto& kv : d.items) {
          std::string key = key_text(kv.first);
          if (strip && kv.second.kind == Kind::kTensor) {
            key.erase(0, kPrefix.size());
            ++stripped_;
          }
          walk(kv.second, child(path, key), depth + 1);
        }
        on_path_dicts_.erase(index);
        return;
      }
      case Kind::kList:
      case Kind::kTuple: {
        const size_t index = static_cast<size_t>(v.i);
        const bool list = v.kind == Kind::kList;
        if (heap_.seqs[index].empty()) return skip(path, list ? "list []" : "tuple ()");
        if (on_path_seqs_.count(index)) fail_at(path, fmt::format("a {} that contains itself", kind_name(v.kind)));
        on_path_seqs_.insert(index);
        // Index, not reference: a nested walk may not grow heap_.seqs, but stay safe anyway.
        for (size_t k = 0; k < heap_.seqs[index].size(); ++k) {
          const Value e = heap_.seqs[index][k];
          walk(e, child(path, std::to_string(k)), depth + 1);
        }
        on_path_seqs_.erase(index);
        return;
      }
      case Kind::kNone:
        return skip(path, "None");
      case Kind::kBool:
        return skip(path, v.i ? "bool True" : "bool False");
      case Kind::kInt:
        return skip(path, fmt::format("int {}", v.i));
      case Kind::kFloat:
        return skip(path, "float " + python_float(v.f));
      case Kind::kStr: {
        const std::string& s = str(v);
        if (s.size() <= kShownChars) return skip(path, "str '" + shown(s, kShownChars) + "'");
        size_t cut = kShownChars;  // at a character boundary
        while (cut > 0 && (static_cast<uint8_t>(s[cut]) & 0xc0) == 0x80) --cut;
        return skip(path, fmt::format("str '{}...' ({} bytes)", shown(s.substr(0, cut), cut), s.size()));
      }
      case Kind::kBytes:
        return skip(path, fmt::format("bytes ({} bytes)", str(v).size()));
      case Kind::kGlobal:
        return skip(path, "type " + global_name(v.i));
      case Kind::kStorage: {
        const Storage& s = heap_.storages[static_cast<size_t>(v.i)];
        return skip(path, fmt::format("storage of {} {} elements", s.numel, dtype_name(s.dtype)));
      }
      case Kind::kEmpty:
        break;
    }
    fail_at(path, "an unset value");
  }

  PtContents flatten(const Value& root, size_t pickle_size) {
    // Budgets proportional to the pickle: a legitimate file visits each value about once and
    // builds names a few times longer than its keys; shared containers can do no more.
    visit_budget_ = 8 * static_cast<uint64_t>(pickle_size) + 65536;
    name_budget_ = 32 * static_cast<uint64_t>(pickle_size) + (uint64_t{1} << 20);
    if (root.kind == Kind::kTensor) {
      walk(root, "tensor", 0);
    } else if (root.kind == Kind::kDict || root.kind == Kind::kList || root.kind == Kind::kTuple) {
      walk(root, "", 0);
    } else {
      walk(root, "value", 0);
    }
    if (stripped_ > 0)
      out_.notes.push_back(fmt::format("stripped the DDP prefix 'module.' from {} names (X4)", stripped_));
    if (!locations_.empty()) {
      out_.notes.push_back(fmt::format("storages saved on {} read to CPU (T13)", fmt::join(locations_, ", ")));
    }
    return std::move(out_);
  }

  // Input.
  const uint8_t* data_;
  size_t size_;
  std::string name_;
  std::shared_ptr<const void> owner_;

  // Archive.
  ZipArchive archive_;
  std::string pkl_member_ = "data.pkl";
  std::string prefix_;
  int64_t pkl_index_ = -1;
  bool big_endian_ = false;
  std::unordered_map<std::string, MemberBytes> member_bytes_;         // by storage key
  std::map<std::pair<std::string, DType>, MemberBytes> typed_bytes_;  // native order, aligned
  std::map<std::tuple<std::string, DType, int64_t>, size_t> storage_index_;
  std::set<std::string> locations_;  // other than "cpu" (the first 8)

  // Unpickler.
  const uint8_t* p_ = nullptr;
  size_t n_ = 0;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::vector<Value> memo_;
  uint64_t memo_count_ = 0;
  Heap heap_;

  // Flattening.
  PtContents out_;
  std::unordered_set<std::string> tensor_names_;
  std::unordered_set<size_t> on_path_dicts_, on_path_seqs_;
  size_t stripped_ = 0;
  uint64_t visits_ = 0, visit_budget_ = 0;
  uint64_t name_bytes_ = 0, name_budget_ = 0;
};

}  // namespace

PtContents parse_pt(const uint8_t* data, size_t size, const std::string& name, std::shared_ptr<const void> owner) {
  PtReader reader(data, size, name, std::move(owner));
  return reader.read();
}

PtContents read_pt(const std::string& path) {
  std::shared_ptr<const MappedFile> file = MappedFile::open(path);
  return parse_pt(file->data(), file->size(), path, file);
}

}  // namespace crucible::io
