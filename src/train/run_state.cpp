// CheckpointIO: one checkpoint schema, written and read by the same list (see run_state.h).
#include "crucible/train/run_state.h"

#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/error.h"
#include "crucible/nn/model.h"

namespace crucible::train {

CheckpointIO CheckpointIO::writer(CheckpointData& out) { return CheckpointIO(&out, nullptr, ""); }

CheckpointIO CheckpointIO::reader(const CheckpointData& in, std::string path) {
  return CheckpointIO(nullptr, &in, std::move(path));
}

void CheckpointIO::tensor(const std::string& name, at::Tensor& t, bool required) {
  if (!reading()) {
    out_->tensors.push_back({name, t});
    return;
  }
  const at::Tensor* src = in_->find(name);
  if (src == nullptr) {
    if (!required) return;
    throw bad_input("{}: checkpoint lacks tensor '{}'", path_, name);
  }
  if (src->sizes() != t.sizes()) {
    throw bad_input("{}: tensor '{}' has shape [{}], the model needs [{}]", path_, name, fmt::join(src->sizes(), ", "),
                    fmt::join(t.sizes(), ", "));
  }
  at::NoGradGuard no_grad;
  t.copy_(*src);
}

void CheckpointIO::module(const std::string& prefix, torch::nn::Module& module) {
  for (const auto& item : {module.named_parameters(true), module.named_buffers(true)}) {
    for (const auto& p : item) {
      at::Tensor t = p.value();
      tensor(prefix + p.key(), t);
    }
  }
}

void CheckpointIO::model(const std::string& prefix, nn::Model& model) {
  for (auto& p : model.named_parameters()) tensor(prefix + p.name, p.tensor);
  for (auto& b : model.named_buffers()) tensor(prefix + b.name, b.tensor);
}

void CheckpointIO::tensor_list(const std::string& prefix, const std::function<std::vector<NamedTensor>()>& get,
                               const std::function<void(const std::vector<NamedTensor>&)>& set) {
  if (!reading()) {
    for (auto& t : get()) out_->tensors.push_back({prefix + t.name, t.tensor});
    return;
  }
  std::vector<NamedTensor> list;
  for (const auto& t : in_->tensors) {
    if (t.name.rfind(prefix, 0) == 0) list.push_back({t.name.substr(prefix.size()), t.tensor});
  }
  set(list);
}

bool CheckpointIO::tensor_via(const std::string& name, const std::function<at::Tensor()>& get,
                              const std::function<void(const at::Tensor&)>& set, bool required) {
  if (!reading()) {
    out_->tensors.push_back({name, get()});
    return true;
  }
  const at::Tensor* src = in_->find(name);
  if (src == nullptr) {
    if (!required) return false;
    throw bad_input("{}: checkpoint lacks tensor '{}'", path_, name);
  }
  set(*src);
  return true;
}

void CheckpointIO::value(const std::string& key, int64_t& v) {
  if (reading()) {
    v = in_->meta_int(key, path_);
  } else {
    out_->meta[key] = std::to_string(v);
  }
}

void CheckpointIO::value(const std::string& key, double& v) {
  if (reading()) {
    v = in_->meta_double(key, path_);
  } else {
    out_->meta[key] = fmt::format("{:.17g}", v);
  }
}

void CheckpointIO::value(const std::string& key, std::string& v) {
  if (!reading()) {
    out_->meta[key] = v;
    return;
  }
  auto it = in_->meta.find(key);
  if (it == in_->meta.end()) throw bad_input("{}: checkpoint lacks metadata '{}'", path_, key);
  v = it->second;
}

void CheckpointIO::note(const std::string& key, const std::string& v) {
  if (!reading()) out_->meta[key] = v;
}

void CheckpointIO::state(RunState& st) {
  value("step", st.step);
  value("epoch", st.epoch);
  value("batch_in_epoch", st.batch_in_epoch);
  value("samples", st.samples);
  value("interval_samples", st.interval_samples);
  value("interval_seconds", st.interval_seconds);
  value("step_seconds", st.step_seconds);
  value("train_seconds", st.train_seconds);
  value("data_wait_seconds", st.data_wait_seconds);
  value("last_test_acc", st.last_test_acc);
  value("last_test_loss", st.last_test_loss);
  // Written since top-5 was added; a checkpoint from before it leaves the field as it is.
  if (!reading() || in_->meta.count("last_test_top5") != 0) value("last_test_top5", st.last_test_top5);
  value("last_eval_step", st.last_eval_step);
  // A detector's COCO numbers, space-separated (absent from a classifier's checkpoint).
  if (!reading() && !st.last_test_coco.empty()) {
    std::string text;
    for (const double x : st.last_test_coco) text += fmt::format("{}{:.17g}", text.empty() ? "" : " ", x);
    out_->meta["last_test_coco"] = text;
  } else if (reading() && in_->meta.count("last_test_coco") != 0) {
    st.last_test_coco.clear();
    std::istringstream in(in_->meta.at("last_test_coco"));
    for (double x = 0; in >> x;) st.last_test_coco.push_back(x);
  }
}

}  // namespace crucible::train
