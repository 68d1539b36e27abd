// Job's own members (see job.h); its assembly is assembly.cpp's.
#include "crucible/train/job.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/sha256.h"
#include "crucible/data/device_input.h"
#include "crucible/data/loader.h"
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
  auto p = ckpt.meta.find("precision");
  auto f = ckpt.meta.find("memory_format");
  if (p != ckpt.meta.end() && f != ckpt.meta.end()) s.precision = Precision::from_fields(p->second, f->second, path);
  if (auto in = ckpt.meta.find("model_input"); in != ckpt.meta.end()) {
    s.input = nn::InputSpec::from_json(in->second, path);
    s.input_source = path;
  }
  return s;
}

std::string params_sha256(nn::Model& model) {
  Sha256 h;
  auto add = [&h](const std::string& name, const at::Tensor& t) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();  // outside the step: the end-of-run digest
    h.update(fmt::format("{}:{}:{}:{}\n", name.size(), name, c10::toString(c.scalar_type()), fmt::join(c.sizes(), ",")));
    h.update(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
  };
  for (const auto& p : model.named_parameters()) add(p.name, p.tensor);
  for (const auto& b : model.named_buffers()) add(b.name, b.tensor);
  return h.hex_digest();
}

}  // namespace crucible::train
