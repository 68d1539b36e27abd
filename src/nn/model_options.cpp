// The [model] section: each model's own keys (one entry per model; the model itself is built by
// model_registry(), model.cpp, under the same name), then the keys every model takes.
#include "crucible/nn/model_options.h"

#include <fmt/format.h>

#include "crucible/core/config.h"

namespace crucible::nn {
namespace {

void declare_none(ModelOptions& /*o*/, ConfigSchema& /*s*/) {}

void declare_fmnist_cnn(ModelOptions& o, ConfigSchema& s) {
  s.add("model", "dropout", &o.dropout, "dropout probability before the last layer").min(0).max(1, true);
}

// A Python model from a file (exported, torchscript).
void declare_program(ModelOptions& o, ConfigSchema& s) {
  if (s.find("model", "path") != nullptr) return;
  s.add("model", "path", &o.path,
        "model.name = \"exported\": the .pt2 archive of crucible.export or torch.export.save; model.name = "
        "\"torchscript\": the module file, saved by torch.jit.save(torch.jit.script(model)) (not traced)");
  s.add("model", "eval_with_train_program", &o.eval_with_train_program,
        "model.name = \"exported\" with one program exported in train mode: evaluate with it anyway (dropout on, "
        "BatchNorm on batch statistics)");
}

// The detectors' keys (declared by the first detector registered).
void declare_detector(ModelOptions& o, ConfigSchema& s) {
  if (s.find("model", "min_size") != nullptr) return;
  DetectorSettings& d = o.detector;
  s.add("model", "min_size", &d.min_size,
        "detectors (GeneralizedRCNNTransform's min_size): each image resized so its shorter side is min_size …")
      .min(1);
  s.add("model", "max_size", &d.max_size, "detectors: … unless its longer side would pass max_size").min(1);
  s.add("model", "trainable_backbone_layers", &d.trainable_backbone_layers,
        "detectors: ResNet stages trained, from the last (0–5; torchvision's default 3: conv1 and layer1 frozen); "
        "the trunk's BatchNorm is FrozenBatchNorm2d (M2)")
      .min(0)
      .max(5);
  s.add("model", "backbone_norm", &d.backbone_norm,
        "detectors: the trunk's norm layers, \"frozen\" (FrozenBatchNorm2d) or \"batch\" (BatchNorm2d); \"auto\" is "
        "torchvision's rule: frozen with trainable_backbone_layers when model.init loads weights, else BatchNorm2d with "
        "all 5 stages trained")
      .choices({"auto", "frozen", "batch"});
  s.add("model", "score_thresh", &d.score_thresh,
        "detectors: detections scoring at most this are dropped (-1: the model's own, FCOS 0.2, RetinaNet 0.05)")
      .min(-1)
      .max(1);
  s.add("model", "nms_thresh", &d.nms_thresh,
        "detectors: batched NMS's IoU threshold (-1: the model's own, FCOS 0.6, RetinaNet 0.5)")
      .min(-1)
      .max(1);
  s.add("model", "detections_per_img", &d.detections_per_img, "detectors: the most detections kept per image").min(1);
  s.add("model", "topk_candidates", &d.topk_candidates, "detectors: the best candidates kept per level before NMS")
      .min(1);
  s.add("model", "center_sampling_radius", &d.center_sampling_radius,
        "FCOS: anchor points within this many strides of a box's centre may match it")
      .positive();
}

}  // namespace

const Registry<ModelSettings>& model_settings_registry() {
  static const Registry<ModelSettings> registry = [] {
    Registry<ModelSettings> r("model");
    r.add("fmnist_cnn", "the default job's CNN: 4 conv3x3-BN-ReLU, 2 max-pools, 2 linear layers", {declare_fmnist_cnn});
    r.add("resnet18", "torchvision's ResNet-18 (same names and init)", {declare_none});
    r.add("resnet34", "torchvision's ResNet-34 (same names and init)", {declare_none});
    r.add("resnet50", "torchvision's ResNet-50 (same names and init)", {declare_none});
    r.add("exported", "a Python model exported by torch.export (model.path: a .pt2 of crucible.export or torch.export.save)",
          {declare_program});
    r.add("torchscript", "a Python model saved by torch.jit.save(torch.jit.script(m)) (model.path)", {declare_program});
    for (const char* kind : {"fcos", "retinanet"}) {
      for (int depth : {18, 34, 50}) {
        r.add(fmt::format("{}_resnet{}_fpn", kind, depth),
              fmt::format("torchvision's {}_resnet50_fpn over ResNet-{} (same state_dict names)", kind, depth),
              {declare_detector, /*detector=*/true});
      }
    }
    return r;
  }();
  return registry;
}

void declare_model_settings(ModelOptions& o, ConfigSchema& s) {
  s.add("model", "name", &o.name, "model architecture").choices(model_settings_registry().names());
  for (const auto& e : model_settings_registry().entries()) e.factory.declare(o, s);
  s.add("model", "init", &o.init,
        "start from these weights: a torch.save state_dict (.pt) or .safetensors; \"module.\" prefixes are stripped "
        "(X4), a classifier head of another class count is re-initialised (\"\" = the model's own init)");
  s.add("model", "init_ignore", &o.init_ignore,
        "model.init: names (glob patterns) allowed to be missing from the file or from the model");
  s.add("model", "freeze", &o.freeze,
        "parameters kept fixed (glob patterns over names, e.g. [\"conv1.*\", \"layer1.*\"]): not optimised, not synced");
}

}  // namespace crucible::nn
