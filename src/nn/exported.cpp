// torch.export programs trained in C++: the PT2 archive (io/pt2.h), each program's JSON turned
// into steps once at load (an operator handle of libtorch's dispatcher and a recipe for every
// schema argument), and a runner that calls the steps through the dispatcher, with autograd
// and autocast as for any eager op. Symbolic sizes (sym_size, _operator.*) have small kernels of
// their own here; no libtorch API runs an exported graph for training (nativert runs under
// InferenceMode with the weights as constants), so this is written by hand.
#include "crucible/nn/exported.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/io/pt2.h"

namespace crucible::nn {
namespace {

using nlohmann::json;

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

std::string schema_text(const c10::FunctionSchema& schema) {
  std::ostringstream os;
  os << schema;
  return os.str();
}

// torch._export.serde.schema.ScalarType → c10.
c10::ScalarType scalar_type(int serde, const std::string& where) {
  switch (serde) {
    case 1: return c10::ScalarType::Byte;
    case 2: return c10::ScalarType::Char;
    case 3: return c10::ScalarType::Short;
    case 4: return c10::ScalarType::Int;
    case 5: return c10::ScalarType::Long;
    case 6: return c10::ScalarType::Half;
    case 7: return c10::ScalarType::Float;
    case 8: return c10::ScalarType::Double;
    case 9: return c10::ScalarType::ComplexHalf;
    case 10: return c10::ScalarType::ComplexFloat;
    case 11: return c10::ScalarType::ComplexDouble;
    case 12: return c10::ScalarType::Bool;
    case 13: return c10::ScalarType::BFloat16;
    default: throw bad_input("{}: scalar type {} of the export schema, which crucible does not run", where, serde);
  }
}

c10::MemoryFormat memory_format(int serde, const std::string& where) {
  switch (serde) {
    case 1: return c10::MemoryFormat::Contiguous;
    case 2: return c10::MemoryFormat::ChannelsLast;
    case 3: return c10::MemoryFormat::ChannelsLast3d;
    case 4: return c10::MemoryFormat::Preserve;
    default: throw bad_input("{}: memory format {} of the export schema is unknown", where, serde);
  }
}

double as_double(const json& j, const std::string& where) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {  // the serializer writes non-finite floats as strings
    const std::string s = j.get<std::string>();
    if (s == "Infinity") return HUGE_VAL;
    if (s == "-Infinity") return -HUGE_VAL;
    if (s == "NaN") return std::nan("");
  }
  throw bad_input("{}: expected a float, found {}", where, j.dump().substr(0, 60));
}

// A tensor of a weights/constants entry: its storage's bytes viewed with the entry's sizes,
// strides and offset, copied (strides kept) into memory of its own.
at::Tensor load_tensor(const io::Pt2Archive& a, const io::Pt2Tensor& t) {
  const std::string where = fmt::format("model.path = \"{}\": \"{}\"", a.path(), t.name);
  const c10::ScalarType dtype = scalar_type(t.serde_dtype, where);
  const io::Pt2Bytes b = a.bytes(t.member);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t numel = 1, last = t.storage_offset;
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    numel *= t.sizes[d];
    if (t.sizes[d] > 0) last += (t.sizes[d] - 1) * t.strides[d];
  }
  if (numel == 0) return at::empty(t.sizes, at::TensorOptions().dtype(dtype));
  if (t.storage_offset < 0 || (last + 1) * elem > static_cast<int64_t>(b.size)) {
    throw bad_input("{}: its sizes [{}] and strides [{}] from offset {} reach past the {} bytes of {}", where,
                    fmt::join(t.sizes, ", "), fmt::join(t.strides, ", "), t.storage_offset, b.size, t.member);
  }
  at::Tensor storage = at::empty({static_cast<int64_t>(b.size) / elem}, at::TensorOptions().dtype(dtype));
  std::memcpy(storage.data_ptr(), b.data, static_cast<size_t>(storage.numel() * elem));
  return storage.as_strided(t.sizes, t.strides, t.storage_offset).clone(at::MemoryFormat::Preserve);
}

// How one schema argument's value is made at run time.
struct ArgSource {
  enum Kind : uint8_t { kConstant, kValue, kTensors, kOptionalTensors, kSymInts, kDevice } kind = kConstant;
  c10::IValue constant;
  int value = -1;
  std::vector<int> values;    // lists: the value of each element, -1 for None or a literal
  std::vector<int64_t> ints;  // kSymInts: the literal where values[i] is -1
};

// Where one returned value goes.
struct OutputSink {
  int value = -1;           // a single value; -1 and no list: dropped
  std::vector<int> values;  // a Tensor[] return: one value per element (-1: unused)
  bool list = false;
};

struct Step {
  enum Kind : uint8_t { kOp, kSymSize, kSymNumel, kOperator, kGetItem, kNoop } kind = kOp;
  std::optional<c10::OperatorHandle> op;
  std::vector<ArgSource> args;
  std::vector<OutputSink> outputs;
  std::string node, target, binop;
  std::vector<int> release;  // values no later step reads
};

struct Program {
  std::string name;
  std::vector<Step> steps;
  int values = 0;
  std::vector<std::pair<int, std::string>> params, buffers, constants;  // value, state name
  std::vector<std::pair<int, c10::IValue>> fixed;                         // constant inputs
  int input = -1, output = -1;
  std::vector<std::pair<int, std::string>> buffer_mutations;  // output value → buffer
  // Mode: the training flags its mode-dependent ops carry (dropout, batch_norm): true, false,
  // or unset when it has none (then either mode runs the same graph).
  std::optional<bool> mode;
  std::string mode_node;  // one such node, for messages
  std::vector<int64_t> input_dims;  // static sizes of the input (-1: symbolic)
  int64_t ops = 0;
};

// JSON program → steps: every node resolved against this libtorch's dispatcher, every argument
// against the op's schema. Throws bad_input naming the node and target it cannot run.
class ProgramBuilder {
 public:
  ProgramBuilder(const std::string& path, const std::string& name) : path_(path) { p_.name = name; }

  Program build(const json& doc) {
    const json& sv = doc.at("schema_version");
    const int major = sv.at("major").get<int>(), minor = sv.at("minor").get<int>();
    if (major != kExportSchemaMajor) {
      throw bad_input("model.path = \"{}\": program \"{}\" has export schema version {}.{}; this crucible reads {}.x "
                      "(export it again with a torch whose torch._export.serde.schema.SCHEMA_VERSION is {}.x)",
                      path_, p_.name, major, minor, kExportSchemaMajor, kExportSchemaMajor);
    }
    const json& gm = doc.at("graph_module");
    const json& graph = gm.at("graph");
    signature_inputs(gm.at("signature"));
    input_meta(graph);
    for (const json& node : graph.at("nodes")) add_node(node);
    signature_outputs(gm.at("signature"));
    lifetimes();
    return std::move(p_);
  }

 private:
  int value(const std::string& name) {
    auto [it, added] = index_.emplace(name, p_.values);
    if (added) ++p_.values;
    return it->second;
  }
  int existing(const std::string& name, const std::string& where) {
    auto it = index_.find(name);
    if (it == index_.end()) throw bad_input("{}: reads \"{}\", which no earlier node or input defines", where, name);
    return it->second;
  }

  void signature_inputs(const json& sig) {
    for (const json& spec : sig.at("input_specs")) {
      const std::string where = fmt::format("model.path = \"{}\": program \"{}\" input {}", path_, p_.name,
                                            spec.dump().substr(0, 80));
      if (spec.contains("parameter")) {
        const json& s = spec["parameter"];
        p_.params.emplace_back(value(s.at("arg").at("name")), s.at("parameter_name").get<std::string>());
      } else if (spec.contains("buffer")) {
        const json& s = spec["buffer"];
        // A non-persistent buffer is no part of the state_dict: the archive keeps it among the
        // constants, and so does crucible (not trained, not checkpointed).
        (s.value("persistent", true) ? p_.buffers : p_.constants)
            .emplace_back(value(s.at("arg").at("name")), s.at("buffer_name").get<std::string>());
      } else if (spec.contains("tensor_constant")) {
        const json& s = spec["tensor_constant"];
        p_.constants.emplace_back(value(s.at("arg").at("name")), s.at("tensor_constant_name").get<std::string>());
      } else if (spec.contains("constant_input")) {
        const json& s = spec["constant_input"];
        const json& v = s.at("value");
        c10::IValue iv;
        if (v.contains("as_int")) iv = v["as_int"].get<int64_t>();
        if (v.contains("as_float")) iv = as_double(v["as_float"], where);
        if (v.contains("as_bool")) iv = v["as_bool"].get<bool>();
        if (v.contains("as_string")) iv = v["as_string"].get<std::string>();
        p_.fixed.emplace_back(value(s.at("name")), iv);
      } else if (spec.contains("user_input")) {
        const json& arg = spec["user_input"].at("arg");
        if (!arg.contains("as_tensor") || p_.input >= 0) {
          throw bad_input("{}: crucible feeds a program one tensor, the image batch; export a forward(x) that takes "
                          "exactly that",
                          where);
        }
        input_name_ = arg["as_tensor"].at("name").get<std::string>();
        p_.input = value(input_name_);
      } else {
        throw bad_input("{}: an input crucible cannot feed (custom objects and effect tokens are not supported)", where);
      }
    }
    if (p_.input < 0) {
      throw bad_input("model.path = \"{}\": program \"{}\" takes no tensor input; crucible feeds it the image batch",
                      path_, p_.name);
    }
  }

  void input_meta(const json& graph) {
    const json& tv = graph.at("tensor_values");
    if (!tv.contains(input_name_)) return;
    for (const json& s : tv[input_name_].at("sizes")) {
      p_.input_dims.push_back(s.contains("as_int") ? s["as_int"].get<int64_t>() : -1);
    }
  }

  void signature_outputs(const json& sig) {
    for (const json& spec : sig.at("output_specs")) {
      const std::string where = fmt::format("model.path = \"{}\": program \"{}\" output {}", path_, p_.name,
                                            spec.dump().substr(0, 80));
      if (spec.contains("user_output")) {
        const json& arg = spec["user_output"].at("arg");
        if (!arg.contains("as_tensor") || p_.output >= 0) {
          throw bad_input("{}: crucible needs forward to return one tensor of logits [batch, classes]", where);
        }
        p_.output = existing(arg["as_tensor"].at("name").get<std::string>(), where);
      } else if (spec.contains("buffer_mutation")) {
        const json& s = spec["buffer_mutation"];
        p_.buffer_mutations.emplace_back(existing(s.at("arg").at("name").get<std::string>(), where),
                                         s.at("buffer_name").get<std::string>());
      } else {
        throw bad_input("{}: an output crucible cannot take (a loss output, gradients or a mutated input: export the "
                        "model's forward only)",
                        where);
      }
    }
    if (p_.output < 0) {
      throw bad_input("model.path = \"{}\": program \"{}\" returns no tensor; crucible needs logits [batch, classes]",
                      path_, p_.name);
    }
  }

  // The argument `j` (one key of the schema's Argument union) for a schema argument of `type`.
  ArgSource argument(const json& j, const std::string& where) {
    ArgSource a;
    const auto& [key, v] = *j.items().begin();
    if (key == "as_none") {
      a.constant = c10::IValue();
    } else if (key == "as_tensor") {
      a.kind = ArgSource::kValue;
      a.value = existing(v.at("name"), where);
    } else if (key == "as_tensors") {
      a.kind = ArgSource::kTensors;
      for (const json& t : v) a.values.push_back(existing(t.at("name"), where));
    } else if (key == "as_optional_tensors") {
      a.kind = ArgSource::kOptionalTensors;
      for (const json& t : v) a.values.push_back(t.contains("as_tensor") ? existing(t["as_tensor"].at("name"), where) : -1);
    } else if (key == "as_optional_tensor") {
      if (v.contains("as_tensor")) {
        a.kind = ArgSource::kValue;
        a.value = existing(v["as_tensor"].at("name"), where);
      }
    } else if (key == "as_int") {
      a.constant = v.get<int64_t>();
    } else if (key == "as_ints") {
      a.constant = c10::List<int64_t>(v.get<std::vector<int64_t>>());
    } else if (key == "as_float") {
      a.constant = as_double(v, where);
    } else if (key == "as_floats") {
      std::vector<double> fs;
      for (const json& f : v) fs.push_back(as_double(f, where));
      a.constant = c10::List<double>(fs);
    } else if (key == "as_bool") {
      a.constant = v.get<bool>();
    } else if (key == "as_bools") {
      c10::List<bool> bs;
      for (const json& b : v) bs.push_back(b.get<bool>());
      a.constant = bs;
    } else if (key == "as_string") {
      a.constant = v.get<std::string>();
    } else if (key == "as_strings") {
      a.constant = c10::List<std::string>(v.get<std::vector<std::string>>());
    } else if (key == "as_sym_int" || key == "as_sym_float" || key == "as_sym_bool") {
      if (v.contains("as_name")) {
        a.kind = ArgSource::kValue;
        a.value = existing(v["as_name"], where);
      } else if (v.contains("as_int")) {
        a.constant = v["as_int"].get<int64_t>();
      } else if (v.contains("as_float")) {
        a.constant = as_double(v["as_float"], where);
      } else {
        a.constant = v.at("as_bool").get<bool>();
      }
    } else if (key == "as_sym_ints") {
      a.kind = ArgSource::kSymInts;
      for (const json& s : v) {
        a.values.push_back(s.contains("as_name") ? existing(s["as_name"], where) : -1);
        a.ints.push_back(s.contains("as_int") ? s["as_int"].get<int64_t>() : 0);
      }
    } else if (key == "as_scalar_type") {
      a.constant = static_cast<int64_t>(scalar_type(v.get<int>(), where));
    } else if (key == "as_memory_format") {
      a.constant = static_cast<int64_t>(memory_format(v.get<int>(), where));
    } else if (key == "as_layout") {
      if (v.get<int>() != 7) throw bad_input("{}: a sparse or mkldnn layout; crucible runs strided tensors", where);
      a.constant = static_cast<int64_t>(c10::Layout::Strided);
    } else if (key == "as_device") {
      a.kind = ArgSource::kDevice;  // the model's device, as torch.export's move_to_device_pass does
    } else {
      throw bad_input("{}: an argument of kind {} ({}), which crucible cannot pass to an op", where, key,
                      key == "as_graph" ? "a subgraph of a higher-order op" : "not a tensor, number, list or option");
    }
    return a;
  }

  OutputSink output(const json& j) {
    OutputSink o;
    const auto& [key, v] = *j.items().begin();
    if (key == "as_tensor") {
      o.value = value(v.at("name"));
    } else if (key == "as_tensors") {
      o.list = true;
      for (const json& t : v) o.values.push_back(value(t.at("name")));
    } else if (key == "as_optional_tensors") {
      o.list = true;
      for (const json& t : v) o.values.push_back(t.contains("as_tensor") ? value(t["as_tensor"].at("name")) : -1);
    } else if (key == "as_sym_int" || key == "as_sym_float" || key == "as_sym_bool") {
      if (v.contains("as_name")) o.value = value(v["as_name"]);
    }
    return o;  // as_none and the rest: dropped
  }

  void add_node(const json& node) {
    Step s;
    s.target = node.at("target").get<std::string>();
    s.node = node.contains("name") && node["name"].is_string() ? node["name"].get<std::string>() : s.target;
    const std::string where =
        fmt::format("model.path = \"{}\": program \"{}\", node \"{}\" ({})", path_, p_.name, s.node, s.target);
    const json& inputs = node.at("inputs");
    const json& outputs = node.at("outputs");
    static const std::set<std::string> kNoops = {
        "torch.ops.aten._assert_scalar.default", "torch.ops.aten.sym_constrain_range_for_size.default",
        "torch.ops.aten.sym_constrain_range.default", "torch.ops.aten._assert_tensor_metadata.default",
        "torch.ops.aten._assert_async.msg"};
    if (kNoops.count(s.target) != 0) {
      s.kind = Step::kNoop;
    } else if (s.target == "torch.ops.aten.sym_size.int" || s.target == "torch.ops.aten.sym_stride.int") {
      s.kind = Step::kSymSize;
      s.binop = s.target == "torch.ops.aten.sym_size.int" ? "size" : "stride";
      for (const json& in : inputs) s.args.push_back(argument(in.at("arg"), where));
    } else if (s.target == "torch.ops.aten.sym_numel.default") {
      s.kind = Step::kSymNumel;
      for (const json& in : inputs) s.args.push_back(argument(in.at("arg"), where));
    } else if (s.target == "_operator.getitem") {
      s.kind = Step::kGetItem;
      for (const json& in : inputs) s.args.push_back(argument(in.at("arg"), where));
    } else if (starts_with(s.target, "_operator.") || starts_with(s.target, "torch.sym_") ||
               starts_with(s.target, "math.")) {
      static const std::set<std::string> kOps = {"add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg",
                                                 "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_",
                                                 "sym_max", "sym_min", "sym_not", "sym_float", "sym_int",
                                                 "ceil", "floor"};
      s.kind = Step::kOperator;
      s.binop = s.target.substr(s.target.find('.') + 1);
      if (kOps.count(s.binop) == 0) {
        throw bad_input("{}: a symbolic-size operation crucible has no kernel for (it runs {})", where,
                        fmt::join(kOps, ", "));
      }
      for (const json& in : inputs) s.args.push_back(argument(in.at("arg"), where));
    } else if (starts_with(s.target, "torch.ops.higher_order.")) {
      throw bad_input("{}: a higher-order op (control flow such as torch.cond, or a wrapped subgraph), which crucible "
                      "cannot run: write the branch as tensor ops (torch.where) or keep it in Python",
                      where);
    } else if (starts_with(s.target, "torch.ops.")) {
      add_op(s, inputs, where);
    } else {
      throw bad_input("{}: not an ATen op or a symbolic-size operation; crucible runs torch.ops.* targets", where);
    }
    for (const json& out : outputs) s.outputs.push_back(output(out));
    ++p_.ops;
    p_.steps.push_back(std::move(s));
  }

  void add_op(Step& s, const json& inputs, const std::string& where) {
    // torch.ops.<namespace>.<op>.<overload> → "<namespace>::<op>" and its overload ("" for default)
    const std::string rest = s.target.substr(std::strlen("torch.ops."));
    const auto dot1 = rest.find('.'), dot2 = rest.rfind('.');
    if (dot1 == std::string::npos || dot2 == dot1) throw bad_input("{}: a target without namespace.op.overload", where);
    const std::string op_name = rest.substr(0, dot1) + "::" + rest.substr(dot1 + 1, dot2 - dot1 - 1);
    std::string overload = rest.substr(dot2 + 1);
    if (overload == "default") overload.clear();
    auto handle = c10::Dispatcher::singleton().findSchema({op_name, overload});
    if (!handle) {
      throw bad_input("{}: this libtorch ({}) has no op {}{}{} (a custom op, or one of a newer torch): crucible runs "
                      "the ops registered in its libtorch",
                      where, compat::torch_version(), op_name, overload.empty() ? "" : ".", overload);
    }
    s.kind = Step::kOp;
    s.op = *handle;
    const c10::FunctionSchema& schema = handle->schema();
    std::unordered_map<std::string, const json*> by_name;
    for (const json& in : inputs) by_name[in.at("name").get<std::string>()] = &in.at("arg");
    for (const c10::Argument& arg : schema.arguments()) {
      auto it = by_name.find(arg.name());
      if (it == by_name.end()) {
        if (!arg.default_value()) {
          throw bad_input("{}: no value for the op's argument \"{}\" and no default in this libtorch's schema {}", where,
                          arg.name(), schema_text(schema));
        }
        ArgSource a;
        a.constant = *arg.default_value();
        s.args.push_back(std::move(a));
        continue;
      }
      s.args.push_back(argument(*it->second, where + " argument \"" + arg.name() + "\""));
      by_name.erase(it);
      ArgSource& a = s.args.back();
      if (a.kind == ArgSource::kConstant && arg.type()->kind() == c10::TypeKind::TensorType &&
          (a.constant.isInt() || a.constant.isDouble() || a.constant.isBool())) {
        // A Python number where the schema takes a Tensor (add_(buffer, 1)): a wrapped number, as
        // Python's binding makes it, so that type promotion treats it as a scalar.
        at::Tensor t = a.constant.isInt()      ? at::scalar_to_tensor(at::Scalar(a.constant.toInt()))
                       : a.constant.isDouble() ? at::scalar_to_tensor(at::Scalar(a.constant.toDouble()))
                                               : at::scalar_to_tensor(at::Scalar(a.constant.toBool()));
        t.unsafeGetTensorImpl()->set_wrapped_number(true);
        a.constant = t;
      }
      if ((arg.name() == "train" || arg.name() == "training") && s.args.back().kind == ArgSource::kConstant &&
          s.args.back().constant.isBool()) {
        const bool mode = s.args.back().constant.toBool();
        if (p_.mode && *p_.mode != mode) {
          throw bad_input("{}: runs with {} = {} where node \"{}\" runs the other mode: a program is exported in one "
                          "mode (export model.train() and model.eval() separately: crucible.export does)",
                          where, arg.name(), mode, p_.mode_node);
        }
        p_.mode = mode;
        p_.mode_node = s.node;
      }
    }
    if (!by_name.empty()) {
      throw bad_input("{}: passes \"{}\", which this libtorch's ({}) schema of the op does not have: {}", where,
                      by_name.begin()->first, compat::torch_version(), schema_text(schema));
    }
  }

  // Each value is released after the last step that reads it (the output and the state are
  // never released), so a forward holds only what autograd or later steps still need.
  void lifetimes() {
    std::vector<int> last(static_cast<size_t>(p_.values), -1);
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      for (const ArgSource& a : p_.steps[i].args) {
        if (a.value >= 0) last[static_cast<size_t>(a.value)] = static_cast<int>(i);
        for (int v : a.values) {
          if (v >= 0) last[static_cast<size_t>(v)] = static_cast<int>(i);
        }
      }
    }
    std::set<int> keep = {p_.output};
    for (const auto& m : p_.buffer_mutations) keep.insert(m.first);
    for (const auto& v : p_.params) keep.insert(v.first);
    for (const auto& v : p_.buffers) keep.insert(v.first);
    for (const auto& v : p_.constants) keep.insert(v.first);
    for (size_t v = 0; v < last.size(); ++v) {
      if (last[v] >= 0 && keep.count(static_cast<int>(v)) == 0) {
        p_.steps[static_cast<size_t>(last[v])].release.push_back(static_cast<int>(v));
      }
    }
  }

  std::string path_;
  Program p_;
  std::unordered_map<std::string, int> index_;
  std::string input_name_;
};

// Python's semantics on ints and floats for the symbolic-size operations.
c10::IValue apply_operator(const std::string& op, const std::vector<c10::IValue>& a, const std::string& where) {
  auto num = [](const c10::IValue& v) { return v.isInt() ? static_cast<double>(v.toInt()) : v.isBool() ? v.toBool() : v.toDouble(); };
  if (a.size() == 1) {
    const c10::IValue& x = a[0];
    if (op == "neg") return x.isInt() ? c10::IValue(-x.toInt()) : c10::IValue(-x.toDouble());
    if (op == "not_" || op == "sym_not") return !x.toBool();
    if (op == "sym_float") return num(x);
    if (op == "sym_int") return x.isInt() ? x.toInt() : static_cast<int64_t>(num(x));
    if (op == "ceil") return static_cast<int64_t>(std::ceil(num(x)));
    if (op == "floor") return static_cast<int64_t>(std::floor(num(x)));
  } else if (a.size() == 2) {
    const c10::IValue &x = a[0], &y = a[1];
    const bool ints = (x.isInt() || x.isBool()) && (y.isInt() || y.isBool());
    if (ints) {
      const int64_t i = x.isInt() ? x.toInt() : x.toBool(), j = y.isInt() ? y.toInt() : y.toBool();
      if (op == "add") return i + j;
      if (op == "sub") return i - j;
      if (op == "mul") return i * j;
      if ((op == "floordiv" || op == "mod") && j == 0) throw bad_input("{}: division by zero", where);
      if (op == "floordiv") return i / j - ((i % j != 0) && ((i < 0) != (j < 0)) ? 1 : 0);
      if (op == "mod") return ((i % j) + j) % j;
      if (op == "sym_max") return std::max(i, j);
      if (op == "sym_min") return std::min(i, j);
      if (op == "and_") return x.isBool() && y.isBool() ? c10::IValue(x.toBool() && y.toBool()) : c10::IValue(i & j);
      if (op == "or_") return x.isBool() && y.isBool() ? c10::IValue(x.toBool() || y.toBool()) : c10::IValue(i | j);
    }
    const double u = num(x), v = num(y);
    if (op == "add") return u + v;
    if (op == "sub") return u - v;
    if (op == "mul") return u * v;
    if (op == "truediv") return u / v;
    if (op == "pow") return std::pow(u, v);
    if (op == "floordiv") return std::floor(u / v);
    if (op == "sym_max") return std::max(u, v);
    if (op == "sym_min") return std::min(u, v);
    if (op == "eq") return u == v;
    if (op == "ne") return u != v;
    if (op == "lt") return u < v;
    if (op == "le") return u <= v;
    if (op == "gt") return u > v;
    if (op == "ge") return u >= v;
  }
  throw bad_input("{}: {} with {} operands is not a symbolic-size operation crucible runs", where, op, a.size());
}

class ExportedModel final : public Model {
 public:
  ExportedModel(std::string path, std::vector<Program> programs, int train_index, int eval_index,
                std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                std::map<std::string, at::Tensor> constants, InputSpec spec)
      : path_(std::move(path)),
        programs_(std::move(programs)),
        train_index_(train_index),
        eval_index_(eval_index),
        params_(std::move(params)),
        buffers_(std::move(buffers)),
        constants_(std::move(constants)),
        spec_(std::move(spec)) {
    for (const auto& p : params_) by_name_[p.name] = p.tensor;
    for (const auto& b : buffers_) by_name_[b.name] = b.tensor;
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (training_) {
      const Program& p = programs_[static_cast<size_t>(train_index_)];
      if (p.mode && !*p.mode) {
        throw bad_input("model.path = \"{}\": program \"{}\" was exported in eval mode (node \"{}\" runs with training "
                        "= False), so training it would run dropout off and BatchNorm on running statistics: export "
                        "model.train() too (crucible.export(model, example, path) writes both modes)",
                        path_, p.name, p.mode_node);
      }
      return run(p, x);
    }
    if (eval_index_ >= 0) return run(programs_[static_cast<size_t>(eval_index_)], x);
    const Program& p = programs_[static_cast<size_t>(train_index_)];
    if (!p.mode || !*p.mode) return run(p, x);
    // model.eval_with_train_program: the train-mode program, its buffer updates undone.
    std::vector<at::Tensor> saved;
    for (const auto& b : buffers_) saved.push_back(b.tensor.clone());
    at::Tensor out = run(p, x);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].tensor.copy_(saved[i]);
    return out;
  }

  std::vector<NamedTensor> named_parameters() override { return params_; }
  std::vector<NamedTensor> named_buffers() override { return buffers_; }
  void train(bool on) override { training_ = on; }
  bool is_training() const override { return training_; }
  void to(c10::Device device) override {
    device_ = device;
    for (auto& p : params_) p.tensor.set_data(p.tensor.data().to(device));
    for (auto& b : buffers_) b.tensor.set_data(b.tensor.to(device));
    for (auto& [name, c] : constants_) c = c.to(device);
  }

  std::string save_program(const std::string& run_dir, const std::string& stem) override;

  InputSpec input_spec() const override { return spec_; }
  std::string describe() const override {
    std::string programs;
    for (const Program& p : programs_) {
      programs += fmt::format("{}{} ({} ops)", programs.empty() ? "" : " + ", p.name, p.ops);
    }
    return fmt::format("exported {} (programs {}; {} parameter tensors)", path_, programs, params_.size());
  }

 private:
  at::Tensor state(const std::string& name) const {
    auto it = by_name_.find(name);
    return it->second;
  }

  at::Tensor run(const Program& p, const at::Tensor& x) {
    std::vector<c10::IValue> env(static_cast<size_t>(p.values));
    for (const auto& [v, name] : p.params) env[static_cast<size_t>(v)] = state(name);
    for (const auto& [v, name] : p.buffers) env[static_cast<size_t>(v)] = state(name);
    for (const auto& [v, name] : p.constants) env[static_cast<size_t>(v)] = constants_.at(name);
    for (const auto& [v, iv] : p.fixed) env[static_cast<size_t>(v)] = iv;
    env[static_cast<size_t>(p.input)] = x;
    std::vector<c10::IValue> stack;
    for (const Step& s : p.steps) {
      stack.clear();
      for (const ArgSource& a : s.args) stack.push_back(make_argument(a, env));
      switch (s.kind) {
        case Step::kOp:
          s.op->callBoxed(&stack);
          break;
        case Step::kSymSize: {
          const at::Tensor& t = stack.at(0).toTensor();
          const int64_t d = stack.at(1).toInt();
          stack = {s.binop == "size" ? t.size(d) : t.stride(d)};
          break;
        }
        case Step::kSymNumel:
          stack = {stack.at(0).toTensor().numel()};
          break;
        case Step::kGetItem: {
          const c10::IValue item = stack.at(0).toListRef().at(static_cast<size_t>(stack.at(1).toInt()));
          stack = {item};
          break;
        }
        case Step::kOperator:
          stack = {apply_operator(s.binop, stack, fmt::format("node \"{}\" ({})", s.node, s.target))};
          break;
        case Step::kNoop:
          stack.clear();
          break;
      }
      for (size_t i = 0; i < s.outputs.size() && i < stack.size(); ++i) {
        const OutputSink& o = s.outputs[i];
        if (o.list) {
          const auto items = stack[i].toListRef();
          for (size_t k = 0; k < o.values.size() && k < items.size(); ++k) {
            if (o.values[k] >= 0) env[static_cast<size_t>(o.values[k])] = items[k];
          }
        } else if (o.value >= 0) {
          env[static_cast<size_t>(o.value)] = std::move(stack[i]);
        }
      }
      for (int v : s.release) env[static_cast<size_t>(v)] = c10::IValue();
    }
    if (!p.buffer_mutations.empty()) {
      at::NoGradGuard no_grad;
      for (const auto& [v, name] : p.buffer_mutations) state(name).copy_(env[static_cast<size_t>(v)].toTensor());
    }
    return env[static_cast<size_t>(p.output)].toTensor();
  }

  c10::IValue make_argument(const ArgSource& a, const std::vector<c10::IValue>& env) const {
    switch (a.kind) {
      case ArgSource::kConstant:
        return a.constant;
      case ArgSource::kValue:
        return env[static_cast<size_t>(a.value)];
      case ArgSource::kTensors: {
        c10::List<at::Tensor> l;
        l.reserve(a.values.size());
        for (int v : a.values) l.push_back(env[static_cast<size_t>(v)].toTensor());
        return l;
      }
      case ArgSource::kOptionalTensors: {
        c10::List<c10::optional<at::Tensor>> l;
        for (int v : a.values) {
          l.push_back(v >= 0 ? c10::optional<at::Tensor>(env[static_cast<size_t>(v)].toTensor()) : c10::nullopt);
        }
        return l;
      }
      case ArgSource::kSymInts: {
        c10::List<int64_t> l;
        for (size_t i = 0; i < a.values.size(); ++i) {
          l.push_back(a.values[i] >= 0 ? env[static_cast<size_t>(a.values[i])].toInt() : a.ints[i]);
        }
        return l;
      }
      case ArgSource::kDevice:
        return device_;
    }
    return c10::IValue();
  }

  std::string path_;
  std::vector<Program> programs_;
  int train_index_, eval_index_;
  std::vector<NamedTensor> params_, buffers_;
  std::map<std::string, at::Tensor> constants_;
  std::unordered_map<std::string, at::Tensor> by_name_;
  InputSpec spec_;
  bool training_ = true;
  c10::Device device_ = c10::Device(c10::kCPU);
};

// The trained weights written into a copy of the archive: each weight member's bytes (the
// storage of one or more tensors) with every tensor viewing it overwritten by the trained
// values, in the member's own dtype, sizes and strides.
std::string ExportedModel::save_program(const std::string& run_dir, const std::string& stem) {
  const std::string out = run_dir + "/" + stem + ".pt2";
  io::Pt2Archive archive(path_);
  std::map<std::string, std::string> replaced;
  at::NoGradGuard no_grad;
  for (const std::string& program : archive.programs()) {
    for (const io::Pt2Tensor& t : archive.weights(program)) {
      auto it = by_name_.find(t.name);
      if (it == by_name_.end()) continue;
      auto [slot, fresh] = replaced.emplace(t.member, std::string());
      if (fresh) {
        const io::Pt2Bytes b = archive.bytes(t.member);
        slot->second.assign(reinterpret_cast<const char*>(b.data), b.size);
      }
      const c10::ScalarType dtype = scalar_type(t.serde_dtype, t.name);
      const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
      at::Tensor storage = at::from_blob(slot->second.data(), {static_cast<int64_t>(slot->second.size()) / elem},
                                         at::TensorOptions().dtype(dtype));
      // outside the step: the end-of-run export
      storage.as_strided(t.sizes, t.strides, t.storage_offset).copy_(it->second.detach().to(at::kCPU));
    }
  }
  io::write_pt2_replacing(path_, out, replaced);
  return out;
}

// The input of every program: one image batch with a batch dimension that varies, and the
// data's shape. bad_input naming the program otherwise.
void check_inputs(const std::vector<Program>& programs, const ModelBuild& b, const std::string& path) {
  const std::vector<int64_t> data = {-1, b.in_channels, b.height, b.width};
  for (const Program& p : programs) {
    if (p.input_dims.size() != 4) {
      throw bad_input("model.path = \"{}\": program \"{}\" takes a {}-dimensional input; the data gives [batch, {}, {}, "
                      "{}]",
                      path, p.name, p.input_dims.size(), b.in_channels, b.height, b.width);
    }
    if (p.input_dims[0] >= 0) {
      throw bad_input("model.path = \"{}\": program \"{}\" was exported for batches of exactly {}; export it with a "
                      "dynamic batch (crucible.export does; torch.export.export(..., dynamic_shapes={{\"x\": {{0: "
                      "torch.export.Dim(\"batch\")}}}}))",
                      path, p.name, p.input_dims[0]);
    }
    for (size_t d = 1; d < 4; ++d) {
      if (p.input_dims[d] >= 0 && p.input_dims[d] != data[d]) {
        throw bad_input("model.path = \"{}\": program \"{}\" takes inputs [batch, {}], the data gives [batch, {}, {}, "
                        "{}]",
                        path, p.name,
                        fmt::join(std::vector<int64_t>(p.input_dims.begin() + 1, p.input_dims.end()), ", "),
                        b.in_channels, b.height, b.width);
      }
    }
  }
}

}  // namespace

std::unique_ptr<Model> make_exported(const ModelBuild& b) {
  const std::string& path = b.options.path;
  if (path.empty()) {
    throw bad_input("model.name = \"exported\" needs model.path: a .pt2 archive written by torch.export.save or "
                    "crucible.export(model, example_input, path)");
  }
  io::Pt2Archive archive(path);
  const std::vector<std::string>& names = archive.programs();
  std::vector<std::string> use;
  if (archive.has_program("train")) {
    // crucible.export names the eval program "model", the name torch.export.load reads.
    use.push_back("train");
    if (archive.has_program("eval")) {
      use.push_back("eval");
    } else if (archive.has_program("model")) {
      use.push_back("model");
    }
  } else if (names.size() == 1) {
    use.push_back(names[0]);
  } else {
    throw bad_input("model.path = \"{}\": the archive holds programs {}; crucible trains \"train\" (and evaluates "
                    "\"model\" or \"eval\"), or the archive's only program",
                    path, fmt::join(names, ", "));
  }
  std::vector<Program> programs;
  for (const std::string& name : use) {
    json doc;
    try {
      doc = json::parse(archive.program_json(name));
      programs.push_back(ProgramBuilder(path, name).build(doc));
    } catch (const json::exception& e) {
      throw bad_input("model.path = \"{}\": program \"{}\" is not an exported program this crucible reads: {}", path,
                      name, e.what());
    }
  }
  // Weights by state name from the training program's config; the eval program binds the same
  // names (crucible.export shares them), its own copies in the archive are not read.
  std::map<std::string, at::Tensor> loaded, constants;
  for (const io::Pt2Tensor& t : archive.weights(use[0])) loaded[t.name] = load_tensor(archive, t);
  for (const std::string& name : use) {
    for (const io::Pt2Tensor& t : archive.constants(name)) constants.emplace(t.name, load_tensor(archive, t));
  }
  std::vector<NamedTensor> params, buffers;
  for (size_t i = 0; i < programs.size(); ++i) {
    const Program& p = programs[i];
    auto need = [&](const std::string& name, const char* what) {
      if (loaded.count(name) == 0) {
        throw bad_input("model.path = \"{}\": program \"{}\" reads {} \"{}\", which {}'s weights do not hold", path,
                        p.name, what, name, use[0]);
      }
    };
    for (const auto& [v, name] : p.params) need(name, "parameter");
    for (const auto& [v, name] : p.buffers) need(name, "buffer");
    for (const auto& [v, name] : p.constants) {
      if (constants.count(name) == 0) {
        throw bad_input("model.path = \"{}\": program \"{}\" reads constant \"{}\", which the archive does not hold",
                        path, p.name, name);
      }
    }
    if (i > 0 && (p.params.size() != programs[0].params.size())) {
      throw bad_input("model.path = \"{}\": programs \"{}\" and \"{}\" have {} and {} parameters; the eval program must "
                      "read the train program's parameters by name",
                      path, programs[0].name, p.name, programs[0].params.size(), p.params.size());
    }
  }
  for (const auto& [v, name] : programs[0].params) {
    at::Tensor t = loaded.at(name);
    t.set_requires_grad(true);  // model.freeze says what stays fixed
    params.push_back({name, t});
  }
  for (const auto& [v, name] : programs[0].buffers) buffers.push_back({name, loaded.at(name)});

  check_inputs(programs, b, path);
  const Program& train = programs[0];
  const int eval_index = programs.size() > 1 ? 1 : -1;
  if (eval_index < 0 && train.mode && *train.mode && !b.options.eval_with_train_program) {
    throw bad_input("model.path = \"{}\": its one program \"{}\" was exported in train mode (node \"{}\" runs with "
                    "training = True) and its mode is fixed, so evaluating with it would run dropout and BatchNorm's "
                    "batch statistics; export both modes into one archive (crucible.export(model, example_input, "
                    "path)), or set model.eval_with_train_program = true to evaluate in train mode anyway",
                    path, train.name, train.mode_node);
  }
  if (eval_index >= 0 && programs[1].mode && *programs[1].mode) {
    throw bad_input("model.path = \"{}\": program \"{}\" was exported in train mode (node \"{}\" runs with training "
                    "= True): export model.eval() for it",
                    path, programs[1].name, programs[1].mode_node);
  }
  if (eval_index < 0 && train.mode && *train.mode) {
    log_warn("model.path = \"{}\": one program, exported in train mode: evaluation runs it too "
             "(model.eval_with_train_program), with dropout on and BatchNorm on batch statistics",
             path);
  }
  auto model = std::make_unique<ExportedModel>(path, std::move(programs), 0, eval_index, std::move(params),
                                               std::move(buffers), std::move(constants),
                                               InputSpec{b.in_channels, b.height, b.width, std::nullopt, {}, {}});
  // Start-up check (law 6): forward of two zero images in eval mode gives [2, num_classes].
  model->train(false);
  at::Tensor out;
  try {
    at::NoGradGuard no_grad;
    out = model->forward(at::zeros({2, b.in_channels, b.height, b.width}));
  } catch (const c10::Error& e) {
    throw bad_input("model.path = \"{}\": forward fails on a [2, {}, {}, {}] float batch (the data's shape): {}", path,
                    b.in_channels, b.height, b.width, e.what_without_backtrace());
  }
  model->train(true);
  if (out.dim() != 2 || out.size(0) != 2 || out.size(1) != b.num_classes) {
    throw bad_input("model.path = \"{}\": forward of a [2, {}, {}, {}] batch gives [{}], crucible needs logits [2, {}] "
                    "(the data has {} classes)",
                    path, b.in_channels, b.height, b.width, fmt::join(out.sizes(), ", "), b.num_classes, b.num_classes);
  }
  return model;
}

}  // namespace crucible::nn
