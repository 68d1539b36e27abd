// The YOLOX operations' functional forms (see yolox.h: add_yolox_ops), for the tests that hold
// each to the `yolox` package given the same draws. An operation that reads other samples
// (mosaic, mixup) takes them in its params: image<k> (the [height, width, 3] RGB levels, flat),
// shape<k> [height, width], boxes<k> (xyxy, flat) and labels<k>, k = 1, 2, 3.
#include <functional>
#include <string>
#include <utility>

#include "crucible/core/error.h"
#include "crucible/data/transforms/yolox.h"

namespace crucible::data {
namespace {

int iparam(const DetectionParams& p, const std::string& key, size_t i, const char* op) {
  return static_cast<int>(param(p, key, i, op));
}

const std::vector<double>& values(const DetectionParams& p, const std::string& key, const char* op) {
  const auto it = p.find(key);
  if (it == p.end()) throw bad_input("{}: parameter \"{}\" expected, not given", op, key);
  return it->second;
}

YoloxSample param_sample(const DetectionParams& p, int k, const char* op) {
  const std::string n = std::to_string(k);
  YoloxSample s;
  s.height = iparam(p, "shape" + n, 0, op), s.width = iparam(p, "shape" + n, 1, op);
  const std::vector<double>& image = values(p, "image" + n, op);
  if (s.width < 1 || s.height < 1 || image.size() != static_cast<size_t>(s.width) * s.height * 3) {
    throw bad_input("{}: image{} holds {} values, not {}x{}x3", op, n, image.size(), s.height, s.width);
  }
  s.pixels.assign(image.begin(), image.end());
  s.xyxy = values(p, "boxes" + n, op);
  const std::vector<double>& labels = values(p, "labels" + n, op);
  if (s.xyxy.size() != 4 * labels.size()) {
    throw bad_input("{}: boxes{} holds {} values for {} labels", op, n, s.xyxy.size(), labels.size());
  }
  const auto crowd = p.find("crowd" + n);  // optional: 0/1 per box
  for (size_t i = 0; i < labels.size(); ++i) {
    s.labels.push_back(static_cast<int64_t>(labels[i]));
    s.ids.push_back(1000 * k + static_cast<int64_t>(i));  // box i of sample k
    s.iscrowd.push_back(crowd != p.end() && i < crowd->second.size() && crowd->second[i] != 0);
  }
  return s;
}

double setting(const DetectionParams& p, const std::string& key, double fallback) {
  const auto it = p.find(key);
  return it == p.end() || it->second.empty() ? fallback : it->second[0];
}

std::vector<double> range_setting(const DetectionParams& p, const std::string& key, std::vector<double> fallback) {
  const auto it = p.find(key);
  return it == p.end() ? fallback : it->second;
}

// The whole training transform (YoloxTrain::run) on a data set given in params: samples 0 …
// size - 1, the op's own sample being `index`'s; the settings by their YoloxSettings names (each
// optional: its default), flip_prob (data.hflip) and epoch.
struct TrainRun {
  YoloxSettings o;
  double flip_prob = 0.5;
  DetectionContext context;
};

TrainRun train_run(const DetectionParams& p) {
  constexpr const char* op = "yolox_train";
  TrainRun t;
  YoloxSettings& o = t.o;
  o.size = static_cast<int64_t>(param(p, "input", 0, op));
  o.mosaic_epochs = static_cast<int64_t>(setting(p, "mosaic_epochs", static_cast<double>(o.mosaic_epochs)));
  o.mosaic_prob = setting(p, "mosaic_prob", o.mosaic_prob);
  o.mixup = setting(p, "mixup", o.mixup ? 1 : 0) != 0;
  o.mixup_prob = setting(p, "mixup_prob", o.mixup_prob);
  o.hsv_prob = setting(p, "hsv_prob", o.hsv_prob);
  o.degrees = setting(p, "degrees", o.degrees);
  o.translate = setting(p, "translate", o.translate);
  o.mosaic_scale = range_setting(p, "mosaic_scale", o.mosaic_scale);
  o.mixup_scale = range_setting(p, "mixup_scale", o.mixup_scale);
  o.shear = setting(p, "shear", o.shear);
  o.max_labels = static_cast<int64_t>(setting(p, "max_labels", static_cast<double>(o.max_labels)));
  t.flip_prob = setting(p, "flip_prob", t.flip_prob);
  t.context.epoch = static_cast<int64_t>(setting(p, "epoch", 0));
  t.context.size = static_cast<int64_t>(param(p, "size", 0, op));
  t.context.load = [&p](int64_t i) { return from_yolox(param_sample(p, static_cast<int>(i), "yolox_train")); };
  return t;
}

DetectionOp train_op() {
  return {[](DetectionImage& s, const DetectionParams& p) {
            const TrainRun t = train_run(p);
            ReplayDraws draws(values(p, "draws", "yolox_train"));
            YoloxTrain(t.o, t.flip_prob).run(s, draws, t.context);
            if (draws.left() != 0) throw bad_input("yolox_train: {} of the draws given were not used", draws.left());
          },
          [](const DetectionImage& s, SampleRng& rng, const DetectionParams& o) {
            const TrainRun t = train_run(o);
            std::vector<double> record;
            StreamDraws draws(rng, &record);
            DetectionImage copy = s;
            YoloxTrain(t.o, t.flip_prob).run(copy, draws, t.context);
            return DetectionParams{{"draws", record}};
          }};
}

// An operation's draw from the sample's stream, with every value it drew as "draws": the list
// the tests hand to yolox's patched random and np.random.
using YoloxDraw = DetectionParams (*)(const DetectionImage& s, YoloxDraws& draws, const DetectionParams& settings);
std::function<DetectionParams(const DetectionImage&, SampleRng&, const DetectionParams&)> recorded(YoloxDraw draw) {
  return [draw](const DetectionImage& s, SampleRng& rng, const DetectionParams& settings) {
    std::vector<double> record;
    StreamDraws draws(rng, &record);
    DetectionParams d = draw(s, draws, settings);
    d["draws"] = record;
    return d;
  };
}

// Runs `f` on the sample in YOLOX's arithmetic.
template <typename F>
void in_yolox(DetectionImage& s, F f) {
  YoloxSample y = to_yolox(std::move(s));
  f(y);
  s = from_yolox(std::move(y));
}

DetectionOp mosaic_op() {
  constexpr const char* op = "yolox_mosaic";
  return {[](DetectionImage& s, const DetectionParams& p) {
            in_yolox(s, [&](YoloxSample& y) {
              const YoloxSample a = param_sample(p, 1, op), b = param_sample(p, 2, op), c = param_sample(p, 3, op);
              y = yolox::mosaic({&y, &a, &b, &c}, iparam(p, "center", 0, op), iparam(p, "center", 1, op),
                                iparam(p, "input", 0, op), iparam(p, "input", 1, op));
            });
          },
          recorded([](const DetectionImage&, YoloxDraws& draws, const DetectionParams& o) {
            // MosaicDetection.__getitem__: random() < mosaic_prob, yc, xc, then 3 indices.
            DetectionParams d{{"mosaic", {draws.random() < param(o, "prob", 0, op) ? 1.0 : 0.0}}};
            if (d["mosaic"][0] == 0) return d;
            const double h = param(o, "input", 0, op), w = param(o, "input", 1, op);
            const int yc = static_cast<int>(draws.uniform(0.5 * h, 1.5 * h));
            const int xc = static_cast<int>(draws.uniform(0.5 * w, 1.5 * w));
            d["center"] = {static_cast<double>(xc), static_cast<double>(yc)};
            const auto n = static_cast<int64_t>(param(o, "size", 0, op));
            for (int k = 0; k < 3; ++k) d["indices"].push_back(static_cast<double>(draws.randint(0, n - 1)));
            return d;
          })};
}

DetectionOp mixup_op() {
  constexpr const char* op = "yolox_mixup";
  return {[](DetectionImage& s, const DetectionParams& p) {
            in_yolox(s, [&](YoloxSample& y) {
              yolox::MixupParams m;
              m.jit = param(p, "jit", 0, op);
              m.flip = param(p, "flip", 0, op) != 0;
              m.x_offset = iparam(p, "offset", 0, op), m.y_offset = iparam(p, "offset", 1, op);
              yolox::mixup(y, param_sample(p, 1, op), m, iparam(p, "input", 0, op), iparam(p, "input", 1, op));
            });
          },
          recorded([](const DetectionImage& s, YoloxDraws& draws, const DetectionParams& o) {
            // mixup's order: jit_factor, FLIP, the index (drawn again in training while its
            // sample has no box), then the offsets.
            yolox::MixupParams m;
            m.jit = draws.uniform(param(o, "scale", 0, op), param(o, "scale", 1, op));
            m.flip = draws.uniform(0, 1) > 0.5;
            const auto index = draws.randint(0, static_cast<int64_t>(param(o, "size", 0, op)) - 1);
            yolox::draw_mixup_offsets(draws, &m, iparam(o, "input", 0, op), iparam(o, "input", 1, op), s.height, s.width);
            return DetectionParams{{"jit", {m.jit}},
                                   {"flip", {m.flip ? 1.0 : 0.0}},
                                   {"index", {static_cast<double>(index)}},
                                   {"offset", {static_cast<double>(m.x_offset), static_cast<double>(m.y_offset)}}};
          })};
}

DetectionOp train_transform_op() {
  constexpr const char* op = "yolox_train_transform";
  return {[](DetectionImage& s, const DetectionParams& p) {
            in_yolox(s, [&](YoloxSample& y) {
              yolox::TrainParams t;
              t.hsv = param(p, "hsv", 0, op) != 0;
              for (int c = 0; c < 3 && t.hsv; ++c) t.gains[c] = iparam(p, "gains", c, op);
              t.flip = param(p, "flip", 0, op) != 0;
              yolox::train_transform(y, t, iparam(p, "input", 0, op), iparam(p, "input", 1, op),
                                     iparam(p, "max_labels", 0, op));
            });
          },
          recorded([](const DetectionImage& s, YoloxDraws& draws, const DetectionParams& o) {
            const yolox::TrainParams t =
                yolox::draw_train(draws, to_yolox(s), param(o, "hsv_prob", 0, op), param(o, "flip_prob", 0, op));
            DetectionParams d{{"hsv", {t.hsv ? 1.0 : 0.0}}, {"flip", {t.flip ? 1.0 : 0.0}}};
            for (int c = 0; c < 3; ++c) {
              d["gains"].push_back(t.gains[c]);
              d["hsv_uniform"].push_back(t.hsv_uniform[c]);
              d["hsv_select"].push_back(t.hsv_select[c]);
            }
            return d;
          })};
}

DetectionOp affine_op() {
  constexpr const char* op = "yolox_random_affine";
  return {[](DetectionImage& s, const DetectionParams& p) {
            yolox::AffineParams a;
            a.angle = param(p, "angle", 0, op), a.scale = param(p, "scale", 0, op);
            a.shear_x = param(p, "shear_x", 0, op), a.shear_y = param(p, "shear_y", 0, op);
            a.translate_x = param(p, "translate_x", 0, op), a.translate_y = param(p, "translate_y", 0, op);
            in_yolox(s, [&](YoloxSample& y) { yolox::random_affine(y, a, iparam(p, "target", 0, op), iparam(p, "target", 1, op)); });
          },
          recorded([](const DetectionImage&, YoloxDraws& draws, const DetectionParams& o) {
            const yolox::AffineParams a = yolox::draw_affine(draws, param(o, "degrees", 0, op), param(o, "translate", 0, op),
                                                             param(o, "scale", 0, op), param(o, "scale", 1, op),
                                                             param(o, "shear", 0, op));
            return DetectionParams{{"angle", {a.angle}},     {"scale", {a.scale}},
                                   {"shear_x", {a.shear_x}}, {"shear_y", {a.shear_y}},
                                   {"translate_x", {a.translate_x}}, {"translate_y", {a.translate_y}}};
          })};
}

DetectionOp hsv_op() {
  constexpr const char* op = "yolox_augment_hsv";
  return {[](DetectionImage& s, const DetectionParams& p) {
            const std::array<int, 3> g = {iparam(p, "gains", 0, op), iparam(p, "gains", 1, op), iparam(p, "gains", 2, op)};
            in_yolox(s, [&](YoloxSample& y) { yolox::augment_hsv(y, g); });
          },
          recorded([](const DetectionImage&, YoloxDraws& draws, const DetectionParams& o) {
            std::array<double, 3> u{};
            std::array<int, 3> sel{};
            const std::array<int, 3> g = yolox::draw_hsv_gains(
                draws, {param(o, "gain", 0, op), param(o, "gain", 1, op), param(o, "gain", 2, op)}, &u, &sel);
            return DetectionParams{{"gains", {static_cast<double>(g[0]), static_cast<double>(g[1]), static_cast<double>(g[2])}},
                                   {"uniform", {u[0], u[1], u[2]}},
                                   {"select", {static_cast<double>(sel[0]), static_cast<double>(sel[1]), static_cast<double>(sel[2])}}};
          })};
}

}  // namespace

void add_yolox_ops(Registry<DetectionOp>& r) {
  r.add("yolox_fit", "yolox COCODataset.pull_item's resize: params size [height, width]",
        {[](DetectionImage& s, const DetectionParams& p) {
           in_yolox(s, [&](YoloxSample& y) { yolox::fit(y, iparam(p, "size", 0, "yolox_fit"), iparam(p, "size", 1, "yolox_fit")); });
         },
         nullptr});
  r.add("yolox_preproc", "yolox preproc (the letterbox, fill 114): params size [height, width]",
        {[](DetectionImage& s, const DetectionParams& p) {
           in_yolox(s, [&](YoloxSample& y) {
             yolox::letterbox(y, iparam(p, "size", 0, "yolox_preproc"), iparam(p, "size", 1, "yolox_preproc"));
           });
         },
         nullptr});
  r.add("yolox_augment_hsv", "yolox augment_hsv: params gains [3] (uniform, select: the draws); settings gain [3]", hsv_op());
  r.add("yolox_mirror", "yolox _mirror: params flip (0/1); settings p",
        {[](DetectionImage& s, const DetectionParams& p) {
           if (param(p, "flip", 0, "yolox_mirror") != 0) in_yolox(s, [](YoloxSample& y) { yolox::mirror(y); });
         },
         recorded([](const DetectionImage&, YoloxDraws& draws, const DetectionParams& o) {
           return DetectionParams{{"flip", {draws.random() < param(o, "p", 0, "yolox_mirror") ? 1.0 : 0.0}}};
         })});
  r.add("yolox_random_affine",
        "yolox random_affine: params angle, scale, shear_x, shear_y (degrees), translate_x, translate_y (fractions), "
        "target [width, height]; settings degrees, translate, scale [2], shear",
        affine_op());
  r.add("yolox_mosaic",
        "yolox MosaicDetection's canvas: params center [xc, yc], input [height, width], samples 1-3; settings prob, "
        "size (the data set's), input",
        mosaic_op());
  r.add("yolox_mixup",
        "yolox MosaicDetection.mixup: params jit, flip, offset [x, y], input [height, width], sample 1; settings "
        "scale [2], size, input",
        mixup_op());
  r.add("yolox_train_transform",
        "yolox TrainTransform: params hsv, gains [3], flip, input [height, width], max_labels; settings hsv_prob, "
        "flip_prob",
        train_transform_op());
  r.add("yolox_train",
        "the yolox preset's training transform (MosaicDetection.__getitem__ with TrainTransform): params draws "
        "(every random/uniform/randint value in order), input [size], size and samples 0 … size - 1 (the data set), "
        "epoch and the YoloxSettings by name; the draw returns draws",
        train_op());
}

}  // namespace crucible::data
