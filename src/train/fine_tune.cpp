// Fine-tuning: model.init and model.freeze (see fine_tune.h).
#include "crucible/train/fine_tune.h"

#include <ATen/ATen.h>
#include <fnmatch.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/nn/model.h"
#include "crucible/io/tensor.h"
#include "crucible/io/tensor_file.h"

namespace crucible::train {
namespace {

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string first_names(const std::vector<std::string>& names, size_t n = 8) {
  std::string out = fmt::format("{}", fmt::join(names.begin(), names.begin() + std::min(n, names.size()), ", "));
  if (names.size() > n) out += fmt::format(", … ({} in all)", names.size());
  return out;
}

// Strips `prefix` from every name when every name has it; returns whether it did.
bool strip_common(std::map<std::string, at::Tensor>& tensors, const std::string& prefix) {
  if (tensors.empty()) return false;
  for (const auto& t : tensors) {
    if (t.first.rfind(prefix, 0) != 0) return false;
  }
  std::map<std::string, at::Tensor> out;
  for (auto& t : tensors) out.emplace(t.first.substr(prefix.size()), std::move(t.second));
  tensors = std::move(out);
  return true;
}

// A classifier head of another class count: a Linear's weight or bias whose first dimension is
// num_classes here and another count in the file, all else equal; or a detector's cls_logits
// conv (weight or bias), whose first dimension is anchors × classes.
bool is_class_head(const std::string& name, const at::Tensor& dst, const at::Tensor& src, int64_t num_classes) {
  if (dst.dim() != src.dim() || dst.dim() == 0 || dst.size(0) == src.size(0)) return false;
  for (int64_t d = 1; d < dst.dim(); ++d) {
    if (dst.size(d) != src.size(d)) return false;
  }
  const auto ends_with = [&](const char* tail) {
    const std::string t(tail);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  if (ends_with("cls_logits.weight") || ends_with("cls_logits.bias")) {
    const int64_t anchors = dst.size(0) / num_classes;
    return dst.size(0) % num_classes == 0 && src.size(0) % anchors == 0;
  }
  return (dst.dim() == 1 || dst.dim() == 2) && dst.size(0) == num_classes;
}

// A classification network's weights for a model that holds its trunk (torchvision's
// weights_backbone): moved under the trunk's prefix, without the classifier and BatchNorm's
// batch counters; the rest of the model keeps its initialisation. Returns the note saying so.
std::string into_trunk(std::map<std::string, at::Tensor>& file, const std::string& trunk) {
  std::map<std::string, at::Tensor> moved;
  int64_t dropped = 0;
  for (auto& [name, t] : file) {
    const bool counter = name.size() >= 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0;
    if (name.rfind("fc.", 0) == 0 || counter) {
      ++dropped;
    } else {
      moved.emplace(trunk + name, std::move(t));
    }
  }
  file = std::move(moved);
  return fmt::format("a classification network's weights: loaded into the trunk ({}), as torchvision's "
                     "weights_backbone; its fc and num_batches_tracked ({} tensors) left out",
                     trunk, dropped);
}

// The error of a file that does not fit the model, naming what is missing, extra or mis-shapen.
[[noreturn]] void throw_misfit(const std::string& path, const std::string& model, const std::vector<std::string>& missing,
                               const std::vector<std::string>& unexpected, const std::vector<std::string>& misshapen) {
  std::string what;
  if (!missing.empty()) what += fmt::format("\n  missing from the file ({}): {}", missing.size(), first_names(missing));
  if (!unexpected.empty()) {
    what += fmt::format("\n  in the file but not in the model ({}): {}", unexpected.size(), first_names(unexpected));
  }
  if (!misshapen.empty()) what += fmt::format("\n  of another shape: {}", first_names(misshapen, 4));
  throw bad_input("model.init = \"{}\" does not fit model {}:{}\nlist names that may differ in model.init_ignore "
                  "(glob patterns), or choose the model these weights belong to",
                  path, model, what);
}

}  // namespace

InitReport load_initial_weights(nn::Model& module, const nn::ModelOptions& options, int64_t num_classes) {
  InitReport report;
  const std::string& path = options.init;
  io::TensorSet set = io::read_tensors(path);
  if (set.format != io::Format::kPt && set.format != io::Format::kSafetensors) {
    throw bad_input("model.init = \"{}\": a {} file; weights come from a torch.save state_dict (.pt) or .safetensors",
                    path, io::format_name(set.format));
  }
  report.notes = set.notes;
  std::vector<std::pair<std::string, at::Tensor>> model;
  for (const auto& item : {module.named_parameters(), module.named_buffers()}) {
    for (const auto& p : item) model.emplace_back(p.name, p.tensor);
  }
  std::map<std::string, at::Tensor> file;
  for (const auto& a : set.arrays) file.emplace(a.name, io::to_tensor(a.array, path + ": " + a.name));
  // Wrappers around the names (DDP's "module.", a checkpoint's "state_dict." / "model."), taken
  // off only while no name matches the model as it is.
  auto any_match = [&] {
    for (const auto& m : model) {
      if (file.count(m.first) != 0) return true;
    }
    return false;
  };
  for (const char* wrapper : {"module.", "state_dict.", "model.", "module."}) {
    if (any_match()) break;
    if (strip_common(file, wrapper)) report.notes.push_back(fmt::format("stripped the \"{}\" prefix of every name", wrapper));
  }
  const std::string trunk = module.trunk_prefix();
  const bool trunk_only = !trunk.empty() && !any_match() && file.count("conv1.weight") != 0;
  if (trunk_only) report.notes.push_back(into_trunk(file, trunk));
  std::vector<std::string> missing, unexpected, misshapen;
  std::map<std::string, bool> used;
  at::NoGradGuard no_grad;
  for (auto& [name, dst] : model) {
    auto it = file.find(name);
    if (it == file.end()) {
      if (trunk_only && name.rfind(trunk, 0) != 0) {
        ++report.kept;  // outside the trunk: keeps its initialisation
      } else {
        (matches_any(name, options.init_ignore) ? report.ignored : missing).push_back(name);
      }
      continue;
    }
    used[name] = true;
    const at::Tensor& src = it->second;
    if (src.sizes() != dst.sizes()) {
      const bool head = is_class_head(name, dst, src, num_classes);
      if (head) {
        report.reinitialised.push_back(fmt::format("{} ([{}] in the file, [{}] here)", name, fmt::join(src.sizes(), ", "),
                                                   fmt::join(dst.sizes(), ", ")));
      } else if (!matches_any(name, options.init_ignore)) {
        misshapen.push_back(fmt::format("{}: [{}] in the file, [{}] in the model", name, fmt::join(src.sizes(), ", "),
                                        fmt::join(dst.sizes(), ", ")));
      } else {
        report.ignored.push_back(name);
      }
      continue;
    }
    if (!at::isFloatingType(dst.scalar_type()) && at::isFloatingType(src.scalar_type())) {
      throw bad_input("model.init = \"{}\": '{}' holds {}, the model's is {}", path, name,
                      c10::toString(src.scalar_type()), c10::toString(dst.scalar_type()));
    }
    at::Tensor d = dst;
    d.copy_(src);
    ++report.loaded;
  }
  for (const auto& f : file) {
    if (used.count(f.first) != 0) continue;
    (matches_any(f.first, options.init_ignore) ? report.ignored : unexpected).push_back(f.first);
  }
  if (!missing.empty() || !unexpected.empty() || !misshapen.empty()) {
    throw_misfit(path, options.name, missing, unexpected, misshapen);
  }
  return report;
}

std::vector<NamedTensor> trainable_parameters(nn::Model& module, const std::vector<std::string>& freeze,
                                              std::vector<std::string>* frozen) {
  std::vector<NamedTensor> params;
  std::vector<bool> pattern_used(freeze.size(), false);
  for (const auto& p : module.named_parameters()) {
    // Fixed by the model itself (a detector's frozen trunk stages: trainable_backbone_layers), as
    // torchvision's reference keeps only `p.requires_grad` parameters.
    if (!p.tensor.requires_grad()) continue;
    bool fixed = false;
    for (size_t i = 0; i < freeze.size(); ++i) {
      if (::fnmatch(freeze[i].c_str(), p.name.c_str(), 0) == 0) {
        fixed = true;
        pattern_used[i] = true;
      }
    }
    if (fixed) {
      at::Tensor t = p.tensor;
      t.set_requires_grad(false);
      if (frozen != nullptr) frozen->push_back(p.name);
    } else {
      params.push_back(p);
    }
  }
  for (size_t i = 0; i < freeze.size(); ++i) {
    if (!pattern_used[i]) {
      std::vector<std::string> names;
      for (const auto& p : module.named_parameters()) names.push_back(p.name);
      throw bad_input("model.freeze: pattern \"{}\" matches no parameter (parameters: {})", freeze[i],
                      first_names(names, 12));
    }
  }
  if (params.empty()) throw bad_input("model.freeze fixes every parameter: nothing would train");
  return params;
}

}  // namespace crucible::train
