// Options of the model zoo, torch-free so that configs and tools can name models without
// compiling torch (the models themselves are in nn/model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crucible/core/registry.h"

namespace crucible {
class ConfigSchema;
}

namespace crucible::nn {

// A detector's settings (model.name = "fcos_resnet50_fpn", …): torchvision's keyword arguments
// of the same names (FCOS, RetinaNet, GeneralizedRCNNTransform, _resnet_fpn_extractor).
struct DetectorSettings {
  int64_t min_size = 800;                  // the resize: shorter side to min_size …
  int64_t max_size = 1333;                 // … unless the longer side passes max_size
  int64_t trainable_backbone_layers = 3;   // trunk stages trained, from the last (0–5)
  // The trunk's norm: "frozen" (FrozenBatchNorm2d), "batch" (BatchNorm2d), or "auto": torchvision's
  // rule, frozen with trainable_backbone_layers when weights are loaded (model.init), else
  // BatchNorm2d with every stage trained.
  std::string backbone_norm = "auto";
  double score_thresh = -1;                // -1: the model's own (FCOS 0.2, RetinaNet 0.05)
  double nms_thresh = -1;                  // -1: the model's own (FCOS 0.6, RetinaNet 0.5)
  int64_t detections_per_img = 100;
  int64_t topk_candidates = 1000;
  double center_sampling_radius = 1.5;     // FCOS
};

struct ModelOptions {
  std::string name = "fmnist_cnn";
  double dropout = 0.25;
  // model.name = "torchscript": the module file (torch.jit.save(torch.jit.script(model)));
  // model.name = "exported": the .pt2 archive (torch.export.save, crucible.export).
  std::string path;
  // model.name = "exported" with one program, exported in train mode: evaluate with it anyway
  // (dropout on, BatchNorm on batch statistics; its buffer updates undone).
  bool eval_with_train_program = false;
  // Fine-tuning: weights to start from (a torch.save state_dict .pt or a .safetensors file);
  // "" = the model's own initialisation.
  std::string init;
  // Names in the model or the file that may be missing from the other (glob patterns).
  std::vector<std::string> init_ignore;
  // Parameters kept fixed (glob patterns over parameter names): not optimised, not synced.
  std::vector<std::string> freeze;
  DetectorSettings detector;  // the detectors' keys
};

// A model's own keys of [model] (a key two models share: declared by the first).
struct ModelSettings {
  std::function<void(ModelOptions& options, ConfigSchema& schema)> declare;
  bool detector = false;  // trains on images with boxes (data.dataset = "detection")
};
// Every model by name: model.name's allowed values. model_registry() (nn/model.h, the torch
// side, which the torch-free tools do not link) builds them under the same names
// (tests/train/run_state_test.cpp holds the two to the same names).
const Registry<ModelSettings>& model_settings_registry();

// Binds [model]: the name, each model's own keys, then those every model takes (init, freeze).
void declare_model_settings(ModelOptions& options, ConfigSchema& schema);

// Whether the model's weights come with it (model.path's TorchScript module or exported
// program), so that predict needs no checkpoint.
inline bool weights_in_model_file(const ModelOptions& o) { return o.name == "torchscript" || o.name == "exported"; }

}  // namespace crucible::nn
