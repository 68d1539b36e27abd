// Job's own members (see job.h); its assembly is assembly.cpp's.
#include "crucible/train/job.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/sha256.h"
#include "crucible/data/loader/device_feeder.h"
#include "crucible/data/loader/device_input.h"
#include "crucible/data/loader/loader.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/obs/layer_profile.h"
#include "crucible/obs/phase_clock.h"
#include "crucible/train/checkpoint.h"
#include "crucible/train/evaluator.h"
#include "crucible/train/loss.h"
#include "crucible/train/schedule.h"
#include "crucible/train/step.h"

namespace crucible::train {

Job::Job() = default;
Job::~Job() = default;

void Job::sync_bn_buffers() {
  if (comm && config.dist.bn != DistSection::Bn::kSync) distributed::sync_buffers(*comm, *model, bn_name(config.dist.bn));
}

StoredChoices StoredChoices::of(const CheckpointData& ckpt, const std::string& path) {
  StoredChoices s;
  s.from_checkpoint = true;
  s.input_source = path;
  auto p = ckpt.meta.find("precision");
  auto f = ckpt.meta.find("memory_format");
  if (p != ckpt.meta.end() && f != ckpt.meta.end()) s.precision = Precision::from_fields(p->second, f->second, path);
  if (auto in = ckpt.meta.find("model_input"); in != ckpt.meta.end()) {
    s.input = nn::InputSpec::from_json(in->second, path);
    s.input_source = path;
  }
  if (ckpt.meta.count("num_classes") != 0) s.num_classes = ckpt.meta_int("num_classes", path);
  return s;
}

std::string tensors_sha256(const std::vector<NamedTensor>& tensors) {
  Sha256 h;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();  // outside the step: the end-of-run digest
    h.update(fmt::format("{}:{}:{}:{}\n", name.size(), name, c10::toString(c.scalar_type()), fmt::join(c.sizes(), ",")));
    h.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  }
  return h.hex_digest();
}

std::string params_sha256(nn::Model& model) {
  std::vector<NamedTensor> all = model.named_parameters();
  for (auto& b : model.named_buffers()) all.push_back(std::move(b));
  return tensors_sha256(all);
}

}  // namespace crucible::train
