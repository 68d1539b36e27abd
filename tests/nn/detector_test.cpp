// FCOS and RetinaNet (nn/detection/detector.h) against torchvision's in the oracle Python
// (Debian's torchvision 0.14 here, the venv's in make test-torch2): the models torchvision
// builds for fcos_resnet50_fpn and retinanet_resnet50_fpn (FrozenBatchNorm2d trunk, FPN on
// layer2–layer4, P6/P7 from P5), over a resnet18 trunk to keep them small, with random weights
// and random frozen statistics. Each one's
// state_dict loads into crucible's model as it is (model.init, every name and shape); then, on
// three images of different sizes (one without boxes), the loss dict equals torchvision's to
// 1e-5 relative (crucible sums the foreground by masks, torchvision over selected rows), and
// the detections (score threshold, top-k per level, batched NMS, per-image cap, boxes back in
// each image's pixels) are the same boxes, scores and labels in the same order. The images'
// sizes after the resize are the same whether the scale is computed in float32 (torchvision
// 0.14) or in double (0.15 and later, and crucible): 100 × 140 at min_size 128 would be 127 rows
// in the one and 128 in the other. The third image's height and width scale by different
// ratios (128 / 75, 170 / 100), so boxes mapped back with the ratios swapped are caught.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "crucible/io/npz.h"
#include "crucible/io/tensor.h"
#include "crucible/nn/detection/detector.h"
#include "crucible/nn/mode_guard.h"
#include "crucible/nn/model_options.h"
#include "crucible/train/fine_tune.h"
#include "test_util.h"

namespace crucible::nn {
namespace {

// The oracle for `kind` ("fcos" or "retinanet") with the options of Case below.
std::string oracle(const std::string& dir, int depth, const std::string& kind) {
  return "D = '" + dir + "/'\nDEPTH = " + std::to_string(depth) + "\nKIND = '" + kind + "'\n" +
         R"(import numpy as np, torch, torchvision
from torchvision.ops import misc
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.retinanet import RetinaNet
torch.manual_seed(48)
trunk = getattr(torchvision.models, 'resnet%d' % DEPTH)(weights=None, norm_layer=misc.FrozenBatchNorm2d)
backbone = _resnet_fpn_extractor(trunk, 3, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
if KIND == 'fcos':
    model = FCOS(backbone, 5, min_size=128, max_size=192, score_thresh=0.3, topk_candidates=40, detections_per_img=60)
else:
    model = RetinaNet(backbone, 5, min_size=128, max_size=192, score_thresh=0.05, topk_candidates=40,
                      detections_per_img=60)
with torch.no_grad():
    for m in model.modules():
        if isinstance(m, misc.FrozenBatchNorm2d):
            m.weight.uniform_(0.5, 1.5); m.bias.normal_(0, 0.1)
            m.running_mean.normal_(0, 0.1); m.running_var.uniform_(0.5, 2.0)
    for name, p in model.head.named_parameters():
        if p.dim() == 4: p.normal_(0, 0.03 if KIND == 'fcos' else 0.01)   # RetinaNet's heads have no norm
        elif 'conv' not in name: p.add_(torch.randn_like(p) * 0.5)
    if KIND == 'fcos':
        model.head.regression_head.bbox_reg.bias.add_(3.0)   # boxes 6 strides wide: neighbours overlap, NMS has work
    else:
        model.head.classification_head.cls_logits.bias.add_(2.0)   # scores near 0.1: detections to compare
torch.save(model.state_dict(), D + 'fcos.pt')
sizes = [(64, 90), (96, 64), (75, 100)]   # sizes after the resize the same in float32 (torchvision 0.14) and double (0.15+)
images = [torch.rand(3, h, w) for h, w in sizes]
def boxes(n, h, w):
    xy = torch.rand(n, 2) * torch.tensor([w * 0.7, h * 0.7])
    wh = torch.rand(n, 2) * torch.tensor([w * 0.6, h * 0.6]) + 4
    return torch.cat([xy, torch.minimum(xy + wh, torch.tensor([float(w), float(h)]))], 1)
targets = [{'boxes': boxes(6, 64, 90), 'labels': torch.randint(0, 5, (6,))},
           {'boxes': torch.zeros(0, 4), 'labels': torch.zeros(0, dtype=torch.int64)},
           {'boxes': boxes(3, 75, 100), 'labels': torch.randint(0, 5, (3,))}]
for i, (img, t) in enumerate(zip(images, targets)):
    np.save(D + 'image%d.npy' % i, img.numpy())
    np.save(D + 'boxes%d.npy' % i, t['boxes'].numpy()); np.save(D + 'labels%d.npy' % i, t['labels'].numpy())
model.train()
losses = model(images, targets)
print(' '.join('%s=%r' % (k, v.item()) for k, v in losses.items()))
model.transform.min_size = (75,)   # one multi-scale draw (M4); 75 scales every image exactly in float32
losses = model(images, targets)
print('min_size75', ' '.join('%s=%r' % (k, v.item()) for k, v in losses.items()))
model.transform.min_size = (128,)
losses = model([images[1]], [targets[1]])   # a batch of background only (D19)
print('background', ' '.join('%s=%r' % (k, v.item()) for k, v in losses.items()))
model.eval()
with torch.no_grad():
    dets = model(images)
for i, d in enumerate(dets):
    for k in ('boxes', 'scores', 'labels'): np.save(D + 'det_%s%d.npy' % (k, i), d[k].numpy())
print('detections', ' '.join(str(len(d['scores'])) for d in dets))
)";
}

void expect_equal_to_torchvision(const std::string& kind) {
  test::TempDir d;
  const std::string out = test::run_python(oracle(d.path(), 18, kind));
  ASSERT_NE(out.find("detections"), std::string::npos) << out;

  DetectorOptions o;
  o.num_classes = 5;
  o.min_size = 128;
  o.max_size = 192;
  o.score_thresh = kind == "fcos" ? 0.3 : 0.05;
  o.nms_thresh = kind == "fcos" ? 0.6 : 0.5;
  o.topk_candidates = 40;
  o.detections_per_img = 60;
  at::manual_seed(1);
  std::unique_ptr<Detector> model = kind == "fcos" ? make_fcos(18, o) : make_retinanet(18, o);
  ModelOptions init;
  init.init = d / "fcos.pt";
  const train::InitReport report = train::load_initial_weights(*model, init, o.num_classes);
  // Every tensor of torchvision's state_dict, by its own name, and nothing left over.
  EXPECT_EQ(report.loaded,
            static_cast<int64_t>(model->named_parameters().size() + model->named_buffers().size()));
  EXPECT_TRUE(report.reinitialised.empty());
  EXPECT_TRUE(report.ignored.empty());

  std::vector<at::Tensor> images;
  std::vector<BoxTargets> targets;
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    images.push_back(io::load_npy_tensor(d / ("image" + n + ".npy")));
    targets.push_back({io::load_npy_tensor(d / ("boxes" + n + ".npy")), io::load_npy_tensor(d / ("labels" + n + ".npy"))});
  }
  model->train(true);
  const LossDict losses = model->losses(images, targets);
  // Each term against the oracle's line: "name=value …".
  const auto expect_terms = [&](const LossDict& terms, const std::string& line, bool foreground = true) {
    std::istringstream want(line);
    std::string field;
    ASSERT_EQ(terms.size(), kind == "fcos" ? 3u : 2u);
    for (const auto& [name, value] : terms) {
      ASSERT_TRUE(want >> field) << out;
      const std::string key = field.substr(0, field.find('='));
      const double expected = std::stod(field.substr(field.find('=') + 1));
      EXPECT_EQ(key, name);
      EXPECT_NEAR(value.item<double>(), expected, 1e-5 * std::abs(expected)) << name;
      if (std::getenv("FCOS_PRINT") != nullptr) std::printf("%s crucible %.9g torchvision %.9g\n", name.c_str(), value.item<double>(), expected);
      if (foreground || name == "classification") {
        EXPECT_GT(expected, 0) << name;  // every term has foreground to measure
      } else {
        EXPECT_EQ(value.item<double>(), 0.0) << name;  // no foreground: the box terms are 0, not NaN
      }
    }
  };
  expect_terms(losses, out.substr(0, out.find('\n')));
  // M4: a multi-scale step's min_size (75 here, the model's is 128) trains as torchvision's
  // transform with that min_size, and differs from the model's own size.
  const std::string tag = "min_size75 ";
  const size_t at75 = out.find(tag);
  ASSERT_NE(at75, std::string::npos) << out;
  const LossDict at_75 = model->losses(images, targets, 75);
  expect_terms(at_75, out.substr(at75 + tag.size(), out.find('\n', at75) - at75 - tag.size()));
  EXPECT_NE(at_75[0].second.item<double>(), losses[0].second.item<double>());
  // D19: an image without boxes trains as background, alone in its batch too: the classification
  // term pushes every place towards background, the box terms are 0.
  const std::string bg = "background ";
  const size_t at_bg = out.find(bg);
  ASSERT_NE(at_bg, std::string::npos) << out;
  expect_terms(model->losses({images[1]}, {targets[1]}),
               out.substr(at_bg + bg.size(), out.find('\n', at_bg) - at_bg - bg.size()), /*foreground=*/false);
  // The loss reaches every trained parameter and no frozen one.
  at::Tensor total = losses[0].second;
  for (size_t i = 1; i < losses.size(); ++i) total = total + losses[i].second;
  total.backward();
  for (const auto& p : model->named_parameters()) {
    const bool frozen = p.name.rfind("backbone.body.conv1", 0) == 0 || p.name.rfind("backbone.body.layer1", 0) == 0;
    EXPECT_EQ(p.tensor.requires_grad(), !frozen) << p.name;
    if (!frozen) EXPECT_TRUE(p.tensor.grad().defined()) << p.name;
  }

  model->train(false);
  at::NoGradGuard no_grad;
  const std::vector<Detections> dets = model->detect(images);
  int64_t total_dets = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    const at::Tensor boxes = io::load_npy_tensor(d / ("det_boxes" + n + ".npy"));
    const at::Tensor scores = io::load_npy_tensor(d / ("det_scores" + n + ".npy"));
    const at::Tensor labels = io::load_npy_tensor(d / ("det_labels" + n + ".npy"));
    ASSERT_EQ(dets[i].scores.size(0), scores.size(0)) << "image " << i;
    EXPECT_TRUE(at::allclose(dets[i].scores, scores, 1e-5, 1e-6)) << "image " << i;
    EXPECT_TRUE(at::allclose(dets[i].boxes, boxes, 1e-5, 1e-4)) << "image " << i;
    EXPECT_TRUE(at::equal(dets[i].labels, labels)) << "image " << i;
    total_dets += scores.size(0);
  }
  if (std::getenv("FCOS_PRINT") != nullptr) std::printf("%s", out.c_str());
  EXPECT_GT(total_dets, 5) << out;  // the case must detect something to compare

  // The other way: crucible's weights (changed, so that they are not the file's) written as
  // named arrays load into torchvision's model with strict=True, and give its detections.
  for (auto& p : model->named_parameters()) p.tensor.add_(at::randn_like(p.tensor) * 0.002);
  std::vector<io::NamedArray> arrays;
  for (const auto& group : {model->named_parameters(), model->named_buffers()}) {
    for (const auto& t : group) arrays.push_back({t.name, io::to_array(t.tensor.detach().clone(), t.name)});
  }
  io::write_npz(d / "crucible.npz", arrays, false);
  const std::string back = test::run_python(oracle(d.path(), 18, kind) + R"(
z = np.load(D + 'crucible.npz')
missing, unexpected = model.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files}, strict=True)
model.eval()
with torch.no_grad():
    dets = model(images)
for i, d in enumerate(dets):
    for k in ('boxes', 'scores', 'labels'): np.save(D + 'back_%s%d.npy' % (k, i), d[k].numpy())
print('loaded', len(z.files))
)");
  ASSERT_NE(back.find("loaded " + std::to_string(arrays.size())), std::string::npos) << back;
  const std::vector<Detections> again = model->detect(images);
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    const at::Tensor scores = io::load_npy_tensor(d / ("back_scores" + n + ".npy"));
    ASSERT_EQ(again[i].scores.size(0), scores.size(0)) << "image " << i;
    EXPECT_TRUE(at::allclose(again[i].scores, scores, 1e-5, 1e-6)) << "image " << i;
    EXPECT_TRUE(at::allclose(again[i].boxes, io::load_npy_tensor(d / ("back_boxes" + n + ".npy")), 1e-5, 1e-4));
    EXPECT_TRUE(at::equal(again[i].labels, io::load_npy_tensor(d / ("back_labels" + n + ".npy"))));
    EXPECT_FALSE(at::equal(again[i].scores.narrow(0, 0, std::min(again[i].scores.size(0), dets[i].scores.size(0))),
                           dets[i].scores.narrow(0, 0, std::min(again[i].scores.size(0), dets[i].scores.size(0)))))
        << "the changed weights must change the detections";
  }
}

// ResNet-34 and ResNet-50 trunks: every state_dict name and shape of torchvision's
// fcos_resnet50_fpn / retinanet_resnet50_fpn built over them (FrozenBatchNorm2d, 91 classes), and
// no other tensor; the trunk's frozen stages as trainable_backbone_layers = 3 leaves them.
TEST(Detectors, StateDictNamesShapesAndFrozenStagesAreTorchvisionsM2) {
  const std::string out = test::run_python(R"(import torch, torchvision
from torchvision.ops import misc
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.retinanet import RetinaNet
for kind, cls in (('fcos', FCOS), ('retinanet', RetinaNet)):
    for depth in (34, 50):
        trunk = getattr(torchvision.models, 'resnet%d' % depth)(weights=None, norm_layer=misc.FrozenBatchNorm2d)
        bb = _resnet_fpn_extractor(trunk, 3, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
        m = cls(bb, 91)
        grad = {n for n, p in m.named_parameters() if p.requires_grad}
        for k, v in m.state_dict().items():
            print(kind, depth, k, 'x'.join(str(s) for s in v.shape), int(k in grad))
)");
  for (const std::string kind : {"fcos", "retinanet"}) {
    for (int depth : {34, 50}) {
      DetectorOptions o;
      std::unique_ptr<Detector> m = kind == "fcos" ? make_fcos(depth, o) : make_retinanet(depth, o);
      std::set<std::string> ours, theirs;
      for (const auto& p : m->named_parameters()) {
        ours.insert(p.name + " " + fmt::format("{}", fmt::join(p.tensor.sizes(), "x")) + " " +
                    std::to_string(p.tensor.requires_grad() ? 1 : 0));
      }
      for (const auto& b : m->named_buffers()) {
        ours.insert(b.name + " " + fmt::format("{}", fmt::join(b.tensor.sizes(), "x")) + " 0");
      }
      std::istringstream in(out);
      std::string line;
      const std::string prefix = kind + " " + std::to_string(depth) + " ";
      while (std::getline(in, line)) {
        if (line.rfind(prefix, 0) == 0) theirs.insert(line.substr(prefix.size()));
      }
      EXPECT_GT(theirs.size(), 100u) << out;
      EXPECT_EQ(ours, theirs) << kind << depth;
    }
  }
}

// M8: trained from scratch, a trunk of FrozenBatchNorm2d holds identity statistics — no
// normalisation at all. model.backbone_norm = "auto" follows torchvision's builders: without
// weights (no model.init) fcos_resnet50_fpn(weights=None, weights_backbone=None) has BatchNorm2d
// and trains every stage; every name, shape and trainable flag equals the builder's. With
// model.init the trunk is frozen as over pretrained weights (the M2 test's model).
TEST(Detectors, FromScratchTheTrunkHasBatchNormAndEveryStageTrainsAsTorchvisionsBuilderM8) {
  const std::string out = test::run_python(R"(import torchvision
from torchvision.models.detection import fcos_resnet50_fpn, retinanet_resnet50_fpn
for kind, build in (('fcos', fcos_resnet50_fpn), ('retinanet', retinanet_resnet50_fpn)):
    m = build(weights=None, weights_backbone=None, num_classes=5)
    grad = {n for n, p in m.named_parameters() if p.requires_grad}
    for k, v in m.state_dict().items():
        print(kind, k, 'x'.join(str(s) for s in v.shape), int(k in grad))
)");
  for (const std::string kind : {"fcos", "retinanet"}) {
    ModelOptions o;
    o.name = kind + "_resnet50_fpn";
    std::unique_ptr<Model> m = make_model(o, 3, 800, 800, 5);
    std::set<std::string> ours, theirs;
    for (const auto& p : m->named_parameters()) {
      ours.insert(p.name + " " + fmt::format("{}", fmt::join(p.tensor.sizes(), "x")) + " " +
                  std::to_string(p.tensor.requires_grad() ? 1 : 0));
    }
    for (const auto& b : m->named_buffers()) ours.insert(b.name + " " + fmt::format("{}", fmt::join(b.tensor.sizes(), "x")) + " 0");
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(kind + " ", 0) == 0) theirs.insert(line.substr(kind.size() + 1));
    }
    EXPECT_GT(theirs.size(), 100u) << out;
    EXPECT_EQ(ours, theirs) << kind;
    EXPECT_EQ(ours.count("backbone.body.bn1.num_batches_tracked  0"), 1u);  // BatchNorm2d, not frozen
    o.init = "weights.pt";  // loaded later by model.init: the trunk is built as over pretrained weights
    std::unique_ptr<Model> frozen = make_model(o, 3, 800, 800, 5);
    bool conv1_trains = true;
    for (const auto& p : frozen->named_parameters()) {
      if (p.name == "backbone.body.conv1.weight") conv1_trains = p.tensor.requires_grad();
    }
    EXPECT_FALSE(conv1_trains) << kind;
    for (const auto& b : frozen->named_buffers()) EXPECT_EQ(b.name.find("num_batches_tracked"), std::string::npos) << b.name;
  }
}

// Fine-tuning a detector as torchvision's recipes start one (model.init): from an ImageNet
// ResNet's state_dict (weights_backbone) into the trunk, fc and num_batches_tracked left out and
// the FPN and heads at their initialisation; and from COCO weights (91 classes) to 3 classes,
// every tensor loaded but cls_logits (anchors × classes), which keeps its fresh initialisation.
TEST(Detectors, FineTuneFromAnImageNetTrunkOrFromAnotherClassCount) {
  test::TempDir d;
  test::run_python("D = '" + d.path() + "/'\n" + R"(import torch, torchvision
from torchvision.ops import misc
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.retinanet import RetinaNet
torch.manual_seed(3)
net = torchvision.models.resnet18(weights=None)
with torch.no_grad():
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1); m.running_var.uniform_(0.5, 2.0)
torch.save(net.state_dict(), D + 'imagenet.pt')
for kind, cls in (('fcos', FCOS), ('retinanet', RetinaNet)):
    trunk = torchvision.models.resnet18(weights=None, norm_layer=misc.FrozenBatchNorm2d)
    bb = _resnet_fpn_extractor(trunk, 3, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
    torch.save(cls(bb, 91).state_dict(), D + kind + '_coco.pt')
)");
  for (const std::string kind : {"fcos", "retinanet"}) {
    DetectorOptions o;
    o.num_classes = 3;
    std::unique_ptr<Detector> m = kind == "fcos" ? make_fcos(18, o) : make_retinanet(18, o);
    int64_t trunk = 0, total = 0;
    at::Tensor fpn_before;
    for (const auto& group : {m->named_parameters(), m->named_buffers()}) {
      for (const auto& t : group) {
        ++total;
        trunk += t.name.rfind("backbone.body.", 0) == 0 ? 1 : 0;
        if (t.name == "backbone.fpn.layer_blocks.0.0.weight") fpn_before = t.tensor.clone();
      }
    }
    ModelOptions init;
    init.init = d / "imagenet.pt";
    const train::InitReport r = train::load_initial_weights(*m, init, 3);
    EXPECT_EQ(r.loaded, trunk) << kind;
    EXPECT_EQ(r.kept, total - trunk) << kind;
    ASSERT_FALSE(r.notes.empty());
    EXPECT_NE(r.notes.back().find("backbone.body."), std::string::npos) << r.notes.back();
    const std::string check = test::run_python(
        "import torch\nsd = torch.load('" + (d / "imagenet.pt") + "')\n"
        "print(repr(float(sd['layer4.1.bn2.running_var'].sum())), repr(float(sd['layer3.0.conv2.weight'].sum())))\n");
    std::istringstream in(check);
    double var_sum = 0, conv_sum = 0;
    ASSERT_TRUE(in >> var_sum >> conv_sum) << check;
    for (const auto& t : m->named_buffers()) {
      if (t.name == "backbone.body.layer4.1.bn2.running_var") EXPECT_NEAR(t.tensor.sum().item<double>(), var_sum, 1e-3);
    }
    for (const auto& t : m->named_parameters()) {
      if (t.name == "backbone.body.layer3.0.conv2.weight") EXPECT_NEAR(t.tensor.sum().item<double>(), conv_sum, 1e-3);
      if (t.name == "backbone.fpn.layer_blocks.0.0.weight") EXPECT_TRUE(at::equal(t.tensor, fpn_before)) << kind;
    }

    init.init = d / (kind + "_coco.pt");
    const train::InitReport coco = train::load_initial_weights(*m, init, 3);
    EXPECT_EQ(coco.loaded, total - 2) << kind;
    ASSERT_EQ(coco.reinitialised.size(), 2u) << kind;
    EXPECT_NE(coco.reinitialised[0].find("cls_logits"), std::string::npos) << coco.reinitialised[0];
  }
}

TEST(Fcos, EqualsTorchvisionLossesAndDetectionsBackgroundOnlyBatchesIncludedD19) { expect_equal_to_torchvision("fcos"); }
TEST(RetinaNet, EqualsTorchvisionLossesAndDetectionsBackgroundOnlyBatchesIncludedD19) {
  expect_equal_to_torchvision("retinanet");
}

}  // namespace
}  // namespace crucible::nn
