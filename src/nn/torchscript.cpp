// TorchScript user models: torch::jit::load, the mode-frozen (traced) check on the inlined
// forward graph, and the Model interface over a torch::jit::Module.
#include "crucible/nn/torchscript.h"

#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"

namespace crucible::nn {
namespace {

// The first op (depth first through if/loop blocks) whose train/training argument is a
// constant: a mode train()/eval() cannot change.
std::optional<std::string> frozen_mode_op(const torch::jit::Block* block) {
  for (const torch::jit::Node* n : block->nodes()) {
    for (const torch::jit::Block* inner : n->blocks()) {
      if (auto found = frozen_mode_op(inner)) return found;
    }
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (schema == nullptr) continue;
    for (const char* flag : {"train", "training"}) {
      const c10::optional<int> index = schema->argumentIndexWithName(flag);
      if (!index || static_cast<size_t>(*index) >= n->inputs().size()) continue;
      const torch::jit::Node* source = n->input(static_cast<size_t>(*index))->node();
      if (source->kind() == c10::prim::Constant) {
        std::ostringstream value;
        if (auto iv = torch::jit::toIValue(n->input(static_cast<size_t>(*index)))) value << *iv;
        return fmt::format("{} with {} = {}", n->kind().toQualString(), flag, value.str());
      }
    }
  }
  return std::nullopt;
}

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, std::string path, InputSpec spec)
      : module_(std::move(module)), path_(std::move(path)), spec_(std::move(spec)) {}

  at::Tensor forward(const at::Tensor& x) override {
    std::vector<c10::IValue> inputs{x};
    c10::IValue out = module_.forward(std::move(inputs));
    if (!out.isTensor()) {
      throw bad_input("model.path = \"{}\": forward returned a {}, crucible needs one tensor of logits [batch, "
                      "classes]",
                      path_, out.tagKind());
    }
    return out.toTensor();
  }

  std::vector<NamedTensor> named_parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.push_back({p.name, p.value});
    return out;
  }

  std::vector<NamedTensor> named_buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.push_back({b.name, b.value});
    return out;
  }

  void train(bool on) override { module_.train(on); }
  bool is_training() const override { return module_.is_training(); }
  void to(c10::Device device) override { module_.to(device); }

  std::string save_program(const std::string& run_dir, const std::string& stem) override {
    const std::string path = run_dir + "/" + stem + ".ts.pt";
    // Written in eval mode (ready for inference; Python's .train() switches it back) from CPU
    // copies of the tensors, so torch.jit.load needs no map_location.
    torch::jit::Module copy = module_.deepcopy();
    copy.to(at::kCPU);  // outside the step: the end-of-run export
    copy.train(false);
    std::ostringstream bytes;
    copy.save(bytes);
    write_file_atomic(path, bytes.str());
    return path;
  }

  InputSpec input_spec() const override { return spec_; }
  std::string describe() const override {
    return fmt::format("torchscript {} ({}, {} parameter tensors)", path_, module_.type()->name()->qualifiedName(),
                       module_.parameters().size());
  }

 private:
  torch::jit::Module module_;
  std::string path_;
  InputSpec spec_;
};

}  // namespace

std::unique_ptr<Model> make_torchscript(const ModelBuild& b) {
  const std::string& path = b.options.path;
  if (path.empty()) {
    throw bad_input("model.name = \"torchscript\" needs model.path: a file saved by "
                    "torch.jit.save(torch.jit.script(model))");
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    throw bad_input("model.path = \"{}\": not a TorchScript module torch::jit::load can read (save it with "
                    "torch.jit.save(torch.jit.script(model)), with torch no newer than this crucible's libtorch {}): "
                    "{}",
                    path, compat::torch_version(), e.what_without_backtrace());
  }
  if (module.find_method("forward") == c10::nullopt) {
    throw bad_input("model.path = \"{}\": the module has no forward method", path);
  }
  // The mode check: inline every call, then look at each op that takes a train/training flag.
  std::shared_ptr<torch::jit::Graph> graph = module.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  if (auto op = frozen_mode_op(graph->block())) {
    throw bad_input("model.path = \"{}\": its forward runs {}, fixed when the module was made, so train() and eval() "
                    "cannot switch it (a module made by torch.jit.trace records the mode it was traced in): save "
                    "torch.jit.script(model) instead (and in scripted code pass training=self.training)",
                    path, *op);
  }
  if (module.parameters().size() == 0) {
    throw bad_input("model.path = \"{}\": the module has no parameters to train (torch.jit.freeze and "
                    "optimize_for_inference turn them into constants: save the module before freezing)",
                    path);
  }
  // The executor's profiling and optimisation passes rewrite the graph during the first calls;
  // without them the interpreter runs one graph from the start (bit-exact resume).
  torch::jit::setGraphExecutorOptimize(false);
  for (const auto& p : module.parameters()) p.set_requires_grad(true);  // model.freeze says what stays fixed

  // Start-up check (law 6): forward of two zero images in eval mode gives [2, num_classes].
  const bool was_training = module.is_training();
  module.train(false);
  c10::IValue out;
  try {
    at::NoGradGuard no_grad;
    out = module.forward({at::zeros({2, b.in_channels, b.height, b.width})});
  } catch (const c10::Error& e) {
    throw bad_input("model.path = \"{}\": forward fails on a [2, {}, {}, {}] float batch (the data's shape): {}", path,
                    b.in_channels, b.height, b.width, e.what_without_backtrace());
  }
  module.train(was_training);
  if (!out.isTensor() || out.toTensor().dim() != 2 || out.toTensor().size(0) != 2 ||
      out.toTensor().size(1) != b.num_classes) {
    throw bad_input("model.path = \"{}\": forward of a [2, {}, {}, {}] batch gives {}, crucible needs logits [2, {}] "
                    "(the data has {} classes)",
                    path, b.in_channels, b.height, b.width,
                    out.isTensor() ? fmt::format("[{}]", fmt::join(out.toTensor().sizes(), ", ")) : out.tagKind(),
                    b.num_classes, b.num_classes);
  }
  return std::make_unique<TorchScriptModel>(std::move(module), path,
                                            InputSpec{b.in_channels, b.height, b.width, std::nullopt, {}, {}});
}

}  // namespace crucible::nn
