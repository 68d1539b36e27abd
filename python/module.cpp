// The Python module's native part, `crucible._native` (issue 14): the loader and the io layer
// for PyTorch users who keep their own training loop. Torch-free: batches and arrays leave as
// DLPack capsules that torch.utils.dlpack.from_dlpack turns into tensors without a copy, the
// capsule's deleter owning the batch (or the mapped file) until the last tensor viewing it is
// freed. So one build serves any torch the Python has (1.13 and 2.x alike) and links no
// libtorch. The Python half (python/crucible/__init__.py) wraps these in torch.Tensors.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#if __has_include(<dlpack/dlpack.h>) && !defined(CRUCIBLE_TORCH_DLPACK)
#include <dlpack/dlpack.h>
#else
#include <ATen/dlpack.h>  // the copy a torch wheel carries (no libdlpack-dev: python/CMakeLists.txt)
#endif
#include <fmt/format.h>

#include <cstdint>
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/memory.h"
#include "crucible/core/rng.h"
#include "crucible/core/thread_pool.h"
#include "crucible/data/formats/array_source.h"
#include "crucible/data/transforms/augment.h"
#include "crucible/data/transforms/detection_presets.h"
#include "crucible/data/transforms/batch_draws.h"
#include "crucible/data/image/image_ops.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/samplers/sampler.h"
#include "crucible/data/transforms/transform.h"
#include "crucible/io/tensor_file.h"
#include "crucible/data/data_config.h"
#include "crucible/data/data_recipe.h"
#include "crucible/data/data_setup.h"
#include "crucible/data/data_settings.h"
#include "crucible/data/samplers/grouped_sampler.h"
#include "crucible/data/eval/coco_eval.h"

namespace py = pybind11;

namespace crucible::python {
namespace {

// ---- DLPack ------------------------------------------------------------------------------------

// A DLManagedTensor with the shape, strides and owner its fields point into.
struct Managed {
  DLManagedTensor tensor{};
  std::vector<int64_t> shape, strides;
  std::shared_ptr<const void> owner;
};

void delete_managed(DLManagedTensor* t) { delete static_cast<Managed*>(t->manager_ctx); }

DLDataType dl_dtype(io::DType t, const std::string& what) {
  using io::DType;
  const auto bits = static_cast<uint8_t>(8 * io::dtype_size(t));
  switch (t) {
    case DType::kBool:  // DLPack 0.6 has no bool: as uint8 (the Python side restores bool)
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
      return {kDLUInt, bits, 1};
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      return {kDLInt, bits, 1};
    case DType::kF16:
    case DType::kF32:
    case DType::kF64:
      return {kDLFloat, bits, 1};
    case DType::kBF16:
      return {kDLBfloat, bits, 1};
    case DType::kC64:
    case DType::kC128:
      return {kDLComplex, bits, 1};
    default:
      throw bad_input("{}: {} has no DLPack type (torch cannot take it without a copy)", what, io::dtype_name(t));
  }
}

void capsule_destructor(PyObject* capsule) {
  // Still named "dltensor": no consumer took it, so its deleter is still ours to call.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
}

// A capsule viewing `data` ([shape] of `dtype`, `strides` in elements) while `owner` lives.
py::capsule to_capsule(const void* data, io::DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                       std::shared_ptr<const void> owner, const std::string& what) {
  auto m = std::make_unique<Managed>();
  m->shape = std::move(shape);
  m->strides = std::move(strides);
  m->owner = std::move(owner);
  DLTensor& t = m->tensor.dl_tensor;
  t.data = const_cast<void*>(data);  // torch may write into it: the buffer is the caller's now
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(m->shape.size());
  t.dtype = dl_dtype(dtype, what);
  t.shape = m->shape.data();
  t.strides = m->strides.data();
  t.byte_offset = 0;
  m->tensor.manager_ctx = m.get();
  m->tensor.deleter = &delete_managed;
  PyObject* cap = PyCapsule_New(&m->tensor, "dltensor", &capsule_destructor);
  if (cap == nullptr) throw py::error_already_set();
  m.release();
  return py::reinterpret_steal<py::capsule>(cap);
}

py::capsule array_capsule(const io::Array& a, const std::string& what) {
  return to_capsule(a.data, a.dtype, a.shape, a.strides, a.owner, what);
}

// ---- batch memory from torch (D9) --------------------------------------------------------------

// Batch buffers the Python side hands in: torch tensors it allocated (pinned host memory when
// CUDA is there, D9), so a batch is assembled straight into memory torch owns. Torch then knows
// the memory is pinned, copies from it with non_blocking=True, and its caching host allocator
// keeps a buffer from being reused while such a copy is in flight, which memory of our own
// could not promise. A worker takes a given buffer; when none is free (the Python side tops
// the queue up before each batch, so only in a race) it falls back to the heap rather than wait.
class GivenBuffers : public std::enable_shared_from_this<GivenBuffers> {
 public:
  void give(uintptr_t address, size_t capacity, int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back({reinterpret_cast<uint8_t*>(address), capacity, id});
  }
  size_t free_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  // Ids of given buffers whose batch was dropped before anyone saw it (an epoch restarted):
  // the Python side lets their tensors go. (A batch handed out reports its id too; by then the
  // Python side no longer holds that id, so it is ignored.)
  std::vector<int64_t> released() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(released_, {});
  }
  // The id of the given buffer at `data`, or -1 (a heap buffer).
  int64_t id_of(const uint8_t* data) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = taken_.find(data);
    return it == taken_.end() ? -1 : it->second;
  }

  data::PixelBuffer take(size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity < bytes) continue;
      const Given g = free_[i];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      taken_[g.data] = g.id;
      std::weak_ptr<GivenBuffers> self = shared_from_this();
      // The memory stays torch's: when the batch goes, only the id is reported back.
      std::shared_ptr<void> owner(nullptr, [self, g](void*) {
        if (auto alive = self.lock()) alive->release(g);
      });
      data::PixelBuffer b(g.data, g.capacity, std::move(owner));
      b.resize(bytes);
      return b;
    }
    lock.unlock();
    return data::PixelBuffer::heap(bytes);
  }

 private:
  struct Given {
    uint8_t* data;
    size_t capacity;
    int64_t id;
  };
  void release(const Given& g) {
    std::lock_guard<std::mutex> lock(mu_);
    taken_.erase(g.data);
    released_.push_back(g.id);
  }

  std::mutex mu_;
  std::vector<Given> free_;
  std::map<const uint8_t*, int64_t> taken_;
  std::vector<int64_t> released_;
};

// ---- the loaders ------------------------------------------------------------------------------

// What every loader takes (the Python classes fill it from their keyword arguments). The [data]
// keys and run.seed come as data::DataSettings reads them: the loader's own defaults, then
// settings=, then the keywords given (crop=96 → data.crop=96), which settings must not contradict.
struct LoaderArgs {
  std::string source;                 // ImageLoader: the image source
  std::string features, labels;       // ArrayLoader: array files (ArrayRef syntax: "x.npz:name")
  int64_t batch_size = 0, rank = 0, world_size = 1;
  bool train = true, drop_last = false, nchw = true;
  bool given_buffers = false;          // batches go into buffers the Python side gives (D9)
  std::vector<std::string> defaults;   // the loader's own ("data.hflip=0.0": ArrayLoader flips nothing unasked)
  std::vector<std::string> overrides;  // settings=: "data.cache=decoded", "run.seed=3", …
  std::vector<std::pair<std::string, std::string>> options;  // keywords given: ("crop=96", "data.crop=96")
};

// A pipeline, this rank's sampler and the loader over them; batches out as capsules.
class NativeLoader {
 public:
  // ImageLoader: the pipeline `crucible bench loader` builds for the same settings.
  static std::unique_ptr<NativeLoader> images(const LoaderArgs& a) {
    auto l = std::unique_ptr<NativeLoader>(new NativeLoader(a, "ImageLoader"));
    l->settings_->source("source " + a.source, {{a.train ? "data.train_path" : "data.test_path", a.source}});
    l->pipeline_ = data::make_pipeline_for_path(a.source, l->config_, l->augment_seed(), a.train);
    data::LoaderUse use;
    use.train = use.transforms = use.order = a.train;
    use.images = dynamic_cast<const data::ImagePipeline*>(l->pipeline_.get()) != nullptr || l->pipeline_->detection();
    use.detection = l->pipeline_->detection();
    use.remote = data::is_remote_path(a.source);
    use.eval_switch = "train=False";
    l->start_loader(use);
    return l;
  }

  // ArrayLoader: features and labels memory-mapped (D13), a random flip of uint8 images.
  static std::unique_ptr<NativeLoader> arrays(const LoaderArgs& a) {
    auto l = std::unique_ptr<NativeLoader>(new NativeLoader(a, "ArrayLoader"));
    l->settings_->source("features " + a.features + " and labels " + a.labels,
                         {{"data.train_images", a.features}, {"data.train_labels", a.labels}});
    std::shared_ptr<const data::Source> source =
        data::load_array_source(a.features, a.labels, l->config_.train_samples, "data.train_samples");
    // data.hflip comes with the overrides (the Python side's hflip=), checked by its declaration.
    if (source->spec().type == data::SampleType::kFeatures &&
        l->config_.pieces.get<data::RandomHorizontalFlipOptions>("hflip").p > 0) {
      throw bad_input("ArrayLoader: hflip flips uint8 images; {} holds float features", a.features);
    }
    // The training chain a job with these settings runs: the flip, then data.augment (settings).
    data::SampleTransforms transforms;
    if (source->spec().type == data::SampleType::kPixels) {
      transforms = data::training_transforms(l->config_, source->spec());
    } else if (l->config_.pieces.get<data::AugmentSettings>("augment").name != "none") {
      throw bad_input("ArrayLoader: augment needs uint8 images; {} holds float features", a.features);
    }
    l->pipeline_ = std::make_shared<data::ArrayPipeline>(source, std::move(transforms), l->augment_seed());
    data::LoaderUse use;
    use.order = a.train;  // shuffle=
    use.images = false;
    l->start_loader(use);
    return l;
  }

  int64_t batches_per_epoch() const { return loader_->batches_per_epoch(); }
  int64_t dataset_size() const { return pipeline_->size(); }
  int64_t samples_per_epoch() const { return sampler_->num_samples(); }
  int threads() const { return threads_; }
  int64_t seed() const { return settings_->seed(); }
  // Every [data] key and run.seed with the value this loader runs with, as JSON text.
  std::string settings_json() const { return settings_->values().dump(); }
  // (key, why) of the keys given that this loader does not apply.
  const std::vector<std::pair<std::string, std::string>>& not_applied() const { return not_applied_; }
  std::string describe() const { return pipeline_->describe(); }
  std::string threads_report() const { return threads_report_; }
  int prefetch() const { return prefetch_; }
  // Bytes of a full batch's images (the size of a buffer to give).
  // 0 for detection, whose batches take the size of their images (their memory is the heap's).
  int64_t batch_bytes() const { return args_.batch_size * pipeline_->output_spec().bytes(); }
  std::vector<int64_t> category_ids() const { return pipeline_->category_ids(); }
  std::vector<std::string> class_names() const { return pipeline_->class_names(); }

  // A buffer of `capacity` bytes at `address` for a batch; `id` names it in next() and released().
  void give(uintptr_t address, int64_t capacity, int64_t id) {
    if (!given_) throw std::logic_error("Loader.give: this loader was made without given_buffers");
    given_->give(address, static_cast<size_t>(capacity), id);
  }
  size_t free_buffers() const { return given_ ? given_->free_count() : 0; }
  std::vector<int64_t> released() const { return given_ ? given_->released() : std::vector<int64_t>{}; }

  void start(int64_t epoch, int64_t first_batch) {
    if (epoch < 0 || first_batch < 0 || first_batch > batches_per_epoch()) {
      throw bad_input("loader: cannot start epoch {} at batch {} ({} batches an epoch)", epoch, first_batch,
                      batches_per_epoch());
    }
    py::gil_scoped_release release;
    loader_->start_epoch(epoch, first_batch);
  }

  // (images, labels, batch index, skipped names) — images and labels as capsules — or None
  // after the epoch's last batch. Multi-label data gives its [n, classes] float targets as labels.
  py::object next() {
    std::optional<data::Batch> b;
    {
      py::gil_scoped_release release;  // workers decode; this thread only waits
      b = loader_->next();
    }
    if (!b) return py::none();
    auto batch = std::make_shared<data::Batch>(std::move(*b));
    const data::ImageSpec& s = batch->spec;
    const int64_t n = batch->size();
    const bool features = s.type == data::SampleType::kFeatures;  // always [n, c, h, w] float
    std::vector<int64_t> shape = batch->channels_first || features
                                     ? std::vector<int64_t>{n, s.channels, s.height, s.width}
                                     : std::vector<int64_t>{n, s.height, s.width, s.channels};
    const io::DType dtype = features ? io::DType::kF32 : io::DType::kU8;
    py::capsule images =
        to_capsule(batch->pixels.data(), dtype, shape, io::Array::c_strides(shape), batch, "batch images");
    py::capsule labels =
        batch->target_width > 0
            ? to_capsule(batch->targets.data(), io::DType::kF32, {n, batch->target_width}, {batch->target_width, 1},
                         batch, "batch targets")
            : to_capsule(batch->labels.data(), io::DType::kI64, {n}, {1}, batch, "batch labels");
    py::list skipped;
    for (const auto& name : batch->skipped) skipped.append(name);
    const int64_t buffer = given_ ? given_->id_of(batch->pixels.data()) : -1;
    if (!batch->detection) return py::make_tuple(images, labels, batch->index, skipped, buffer);
    // Detection: each image's size, its id, and the boxes packed with per-image offsets.
    const auto total = static_cast<int64_t>(batch->box_labels.size());
    py::dict det;
    det["sizes"] = to_capsule(batch->image_sizes.data(), io::DType::kI64, {n, 2}, {2, 1}, batch, "image sizes");
    det["image_ids"] = to_capsule(batch->image_ids.data(), io::DType::kI64, {n}, {1}, batch, "image ids");
    det["boxes"] = to_capsule(batch->boxes.data(), io::DType::kF32, {total, 4}, {4, 1}, batch, "boxes");
    det["labels"] = to_capsule(batch->box_labels.data(), io::DType::kI64, {total}, {1}, batch, "box labels");
    det["iscrowd"] = to_capsule(batch->box_crowd.data(), io::DType::kU8, {total}, {1}, batch, "box crowd flags");
    det["offsets"] = to_capsule(batch->box_offsets.data(), io::DType::kI64, {n + 1}, {1}, batch, "box offsets");
    return py::make_tuple(images, labels, batch->index, skipped, buffer, det);
  }

 private:
  NativeLoader(const LoaderArgs& a, const std::string& command)
      : args_(a), settings_(std::make_unique<data::DataSettings>(command, "settings")) {
    if (a.batch_size < 1) throw bad_input("loader: batch_size must be ≥ 1 (found {})", a.batch_size);
    // As the crucible program does: glibc keeps freed blocks up to 32 MiB instead of unmapping them
    // and faulting them back for the next sample (the detection presets' canvases; +12% images/s
    // for the yolox preset from Python, BENCHMARKS.md). Process-wide and idempotent.
    tune_host_allocator();
    // Every [data] key at its default (the default job's [data]), as training reads them.
    for (const auto& d : a.defaults) settings_->command_default(d);
    for (const auto& o : a.overrides) settings_->set(o);
    for (const auto& [given, assignment] : a.options) settings_->option(given, assignment);
    config_ = settings_->data();
  }

  uint64_t augment_seed() const { return derive_seed(static_cast<uint64_t>(seed()), RngStream::kAugment); }

  // The loader over pipeline_; `use` says how it reads the data, for not_applied().
  void start_loader(data::LoaderUse use) {
    use.normalisation = "normalisation's: the loader delivers uint8 pixels; normalise them with dtype=, mean= and "
                        "std= (0-1 units, one per channel)";
    not_applied_ = data::not_applied(*settings_, use);
    int threads = static_cast<int>(config_.threads);
    if (threads == 0) threads = data::choose_loader_threads(*pipeline_, available_cores(), &threads_report_);
    threads_ = threads;
    data::Sampler::Shard shard{args_.world_size, args_.rank, false};
    const uint64_t seed = derive_seed(static_cast<uint64_t>(this->seed()), RngStream::kSampler);
    if (args_.train) {  // the order training takes (data.sampler; "auto": global for URLs)
      data::SamplerBuild order;
      order.size = pipeline_->size();
      order.seed = seed;
      order.shard = shard;
      order.batch = args_.batch_size;
      order.shard_counts = pipeline_->shard_counts();
      order.remote = data::is_remote_path(args_.source);
      order.aspect_ratios = data::aspect_ratios_of(*pipeline_);  // detection: batches grouped by aspect ratio
      sampler_ = data::make_training_sampler(config_, order);
    } else {
      sampler_ = std::make_shared<const data::DistributedSampler>(pipeline_->size(), false, seed, shard);
    }
    data::LoaderOptions o = data::loader_options(config_, args_.batch_size, threads);
    o.drop_last = args_.drop_last;
    o.channels_first = args_.nchw;
    prefetch_ = o.prefetch;
    if (args_.given_buffers) {
      given_ = std::make_shared<GivenBuffers>();
      o.allocate = [given = given_](size_t bytes) { return given->take(bytes); };
    }
    loader_ = std::make_unique<data::Loader>(pipeline_, sampler_, o);
  }

  LoaderArgs args_;
  std::unique_ptr<data::DataSettings> settings_;
  data::DataConfig config_;
  std::vector<std::pair<std::string, std::string>> not_applied_;
  std::shared_ptr<const data::SamplePipeline> pipeline_;
  std::shared_ptr<const data::Sampler> sampler_;
  std::unique_ptr<data::Loader> loader_;
  std::shared_ptr<GivenBuffers> given_;
  int threads_ = 1, prefetch_ = 1;
  std::string threads_report_;
};

// Every key a job's [data] section holds (bind_data_config: the data pieces' and the device's
// batch transforms' among them) with its default as TOML, in the schema's order.
std::vector<std::pair<std::string, std::string>> data_keys() {
  data::DataConfig config;
  ConfigSchema schema;
  data::bind_data_config(config, schema);
  std::vector<std::pair<std::string, std::string>> out;
  for (const ConfigKey* k : schema.keys()) {
    if (k->section() == "data") out.emplace_back(k->full_name(), k->default_toml());
  }
  return out;
}

// ---- files -------------------------------------------------------------------------------------

// {name: capsule} of every array in an npy, npz, safetensors or .pt file (the .pt reader is the
// restricted unpickler: anything but tensors and containers is refused, naming it), plus the
// dtype names (bool travels as uint8).
py::tuple load(const std::string& path) {
  io::TensorSet set;
  {
    py::gil_scoped_release release;
    set = io::read_tensors(path);
  }
  py::dict arrays, dtypes;
  for (const auto& a : set.arrays) {
    arrays[py::str(a.name)] = array_capsule(a.array, path + ": " + a.name);
    dtypes[py::str(a.name)] = io::dtype_name(a.array.dtype);
  }
  return py::make_tuple(arrays, dtypes, io::format_name(set.format));
}

// Writes [(name, dtype name, shape, C-order bytes)] to `path` as the extension says
// (.safetensors, .npy: exactly one array, .npz), atomically: after an error nothing is there.
void save(const std::string& path, const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>,
                                                                 py::buffer>>& items) {
  io::TensorSet set;
  std::vector<py::buffer_info> keep;  // the bytes stay the caller's: viewed, not copied
  keep.reserve(items.size());
  for (const auto& [name, dtype_name, shape, buffer] : items) {
    io::DType dtype;
    if (!io::dtype_from_name(dtype_name, &dtype)) throw bad_input("save {}: {}: unknown dtype {}", path, name, dtype_name);
    keep.push_back(buffer.request());
    const py::buffer_info& b = keep.back();
    io::Array a;
    a.dtype = dtype;
    a.shape = shape;
    a.strides = io::Array::c_strides(shape);
    const uint64_t need = io::checked_nbytes(shape.data(), shape.size(), dtype, path + ": " + name);
    if (static_cast<uint64_t>(b.size * b.itemsize) != need) {
      throw bad_input("save {}: {}: {} bytes for {} {}, expected {}", path, name, b.size * b.itemsize, dtype_name,
                      a.shape_string(), need);
    }
    a.data = static_cast<const uint8_t*>(b.ptr);
    set.arrays.push_back({name, std::move(a)});
  }
  const io::Format format = io::format_for_extension(path);
  py::gil_scoped_release release;
  io::write_tensors(path, format, set);
}

// ---- image operations (crucible.transforms) ------------------------------------------------------

// A writable, C-contiguous uint8 [channels, height, width] array as an ImageRef (planar).
data::ImageRef chw_image(py::buffer& buffer, py::buffer_info& info) {
  info = buffer.request(/*writable=*/true);
  if (info.ndim != 3 || info.itemsize != 1 || info.format != py::format_descriptor<uint8_t>::format()) {
    throw bad_input("image operations take uint8 [channels, height, width] arrays (found {} dimensions of format {})",
                    info.ndim, info.format);
  }
  const auto c = info.shape[0], h = info.shape[1], w = info.shape[2];
  if (info.strides[2] != 1 || info.strides[1] != w || info.strides[0] != w * h) {
    throw bad_input("image operations take C-contiguous arrays");
  }
  return data::ImageRef{static_cast<uint8_t*>(info.ptr), static_cast<int>(w), static_cast<int>(h), static_cast<int>(c),
                        /*planar=*/true};
}

// A detection sample from a uint8 [channels, height, width] array, [n, 4] float32 XYXY boxes and
// n labels (for the tests that hold the detection transforms to torchvision's).
data::DetectionImage detection_sample(py::buffer image, const std::vector<std::array<float, 4>>& boxes,
                                      const std::vector<int64_t>& labels) {
  py::buffer_info info;
  const data::ImageRef chw = chw_image(image, info);
  if (labels.size() != boxes.size()) throw bad_input("detection sample: {} boxes but {} labels", boxes.size(), labels.size());
  data::DetectionImage s;
  s.width = chw.width, s.height = chw.height, s.channels = chw.channels;
  s.pixels.resize(static_cast<size_t>(s.width) * s.height * s.channels);
  const size_t plane = static_cast<size_t>(s.width) * s.height;
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < s.channels; ++c) s.pixels[i * s.channels + c] = chw.pixels[c * plane + i];
  }
  for (size_t i = 0; i < boxes.size(); ++i) {
    s.boxes.add(boxes[i][0], boxes[i][1], boxes[i][2], boxes[i][3], labels[i], false, static_cast<int64_t>(i));
  }
  return s;
}

// (image [C, H, W] uint8, boxes [[x1, y1, x2, y2]], labels, ids: which input box each is) of a sample.
py::tuple detection_result(const data::DetectionImage& s) {
  py::array_t<uint8_t> image({s.channels, s.height, s.width});
  auto out = image.mutable_unchecked<3>();
  for (int y = 0; y < s.height; ++y) {
    for (int x = 0; x < s.width; ++x) {
      for (int c = 0; c < s.channels; ++c) out(c, y, x) = s.pixels[(static_cast<size_t>(y) * s.width + x) * s.channels + c];
    }
  }
  std::vector<std::array<float, 4>> boxes(s.boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (int k = 0; k < 4; ++k) boxes[i][k] = s.boxes.xyxy[4 * i + k];
  }
  return py::make_tuple(image, boxes, s.boxes.labels, s.boxes.ids);
}

// One detection transform's operation with the given parameters (detection_op_registry).
py::tuple detection_op(py::buffer image, const std::vector<std::array<float, 4>>& boxes,
                       const std::vector<int64_t>& labels, const std::string& op, const data::DetectionParams& params) {
  data::DetectionImage s = detection_sample(std::move(image), boxes, labels);
  const data::DetectionOp& o = data::detection_op_registry().get(op, "detection op").factory;
  {
    py::gil_scoped_release release;
    o.apply(s, params);
  }
  return detection_result(s);
}

// The draws one detection transform makes for sample (seed, epoch, index) of this image and boxes.
data::DetectionParams detection_draw(const std::string& op, uint64_t seed, uint64_t epoch, uint64_t index,
                                     py::buffer image, const std::vector<std::array<float, 4>>& boxes,
                                     const std::vector<int64_t>& labels, const data::DetectionParams& settings) {
  const data::DetectionImage s = detection_sample(std::move(image), boxes, labels);
  const data::DetectionOp& o = data::detection_op_registry().get(op, "detection op").factory;
  if (!o.draw) throw bad_input("detection op {} draws nothing", op);
  SampleRng rng(seed, epoch, index);
  return o.draw(s, rng, settings);
}

data::ops::Fill make_fill(const std::vector<double>& values, int channels) {
  data::ops::Fill f;
  if (values.empty()) return f;
  if (values.size() != 1 && values.size() != static_cast<size_t>(channels)) {
    throw bad_input("fill: one value or one per channel ({}) expected, found {}", channels, values.size());
  }
  f.set = true;
  for (size_t c = 0; c < 3; ++c) f.value[c] = static_cast<float>(values[values.size() == 1 ? 0 : std::min<size_t>(c, values.size() - 1)]);
  return f;
}

// One torchvision functional operation, in place: `op` is its name, `args` its numbers in
// torchvision's order (affine: angle, tx, ty, scale, shear_x, shear_y[, cx, cy]).
void image_op(py::buffer buffer, const std::string& op, const std::vector<double>& args, const std::string& interpolation,
              const std::vector<double>& fill) {
  py::buffer_info info;
  const data::ImageRef img = chw_image(buffer, info);
  namespace ops = data::ops;
  auto arg = [&](size_t i) {
    if (i >= args.size()) throw bad_input("{}: {} arguments expected, found {}", op, i + 1, args.size());
    return args[i];
  };
  py::gil_scoped_release release;
  if (op == "adjust_brightness") return ops::adjust_brightness(img, arg(0));
  if (op == "adjust_saturation") return ops::adjust_saturation(img, arg(0));
  if (op == "adjust_contrast") return ops::adjust_contrast(img, arg(0));
  if (op == "adjust_sharpness") return ops::adjust_sharpness(img, arg(0));
  if (op == "posterize") return ops::posterize(img, static_cast<int>(arg(0)));
  if (op == "solarize") return ops::solarize(img, arg(0));
  if (op == "autocontrast") return ops::autocontrast(img);
  if (op == "equalize") return ops::equalize(img);
  if (op == "invert") return ops::invert(img);
  const ops::Interpolation mode = ops::parse_interpolation(interpolation, "interpolation");
  if (op == "affine") {
    const double center[2] = {args.size() >= 8 ? args[6] : 0.0, args.size() >= 8 ? args[7] : 0.0};
    return ops::affine(img, arg(0), arg(1), arg(2), arg(3), arg(4), arg(5), mode, make_fill(fill, img.channels),
                       args.size() >= 8 ? center : nullptr);
  }
  if (op == "rotate") return ops::rotate(img, arg(0), mode, make_fill(fill, img.channels));
  throw bad_input("no image operation \"{}\"", op);
}

data::AugmentOptions augment_options(const std::string& name, const std::map<std::string, double>& numbers,
                                     const std::string& policy, const std::string& interpolation,
                                     const std::vector<double>& fill, int channels) {
  data::AugmentOptions o;
  o.name = name;
  o.policy = policy;
  o.interpolation = interpolation;
  o.fill = make_fill(fill, channels);
  for (const auto& [key, value] : numbers) {
    const int v = static_cast<int>(value);
    if (key == "num_ops") o.num_ops = v;
    else if (key == "magnitude") o.magnitude = v;
    else if (key == "num_magnitude_bins") o.num_magnitude_bins = v;
    else if (key == "severity") o.severity = v;
    else if (key == "mixture_width") o.mixture_width = v;
    else if (key == "chain_depth") o.chain_depth = v;
    else if (key == "alpha") o.alpha = value;
    else if (key == "all_ops") o.all_ops = value != 0;
    else throw bad_input("{}: no option \"{}\"", name, key);
  }
  return o;
}

// The plan a policy draws for sample (seed, epoch, index) of a width × height image:
// [(op name, bin, magnitude)].
std::vector<std::tuple<std::string, int, double>> augment_plan(const std::string& name,
                                                               const std::map<std::string, double>& numbers,
                                                               const std::string& policy, uint64_t seed,
                                                               uint64_t epoch, uint64_t index, int width, int height) {
  auto t = data::make_augment(augment_options(name, numbers, policy, "", {}, 3));
  auto* p = dynamic_cast<const data::AugmentPolicy*>(t.get());
  if (!p) throw bad_input("{}: no plan to show (augmix mixes chains)", name);
  SampleRng rng(seed, epoch, index);
  std::vector<std::tuple<std::string, int, double>> out;
  for (const auto& op : p->plan(rng, width, height)) out.emplace_back(data::augment_op_name(op.op), op.bin, op.magnitude);
  return out;
}

// AugMix's draws for sample (seed, epoch, index) of a width × height image: (m0, m1), the chain
// weights before m1 scales them, and each chain's [(op name, bin, signed magnitude)].
std::tuple<std::pair<float, float>, std::vector<float>, std::vector<std::vector<std::tuple<std::string, int, double>>>>
augmix_plan(const std::map<std::string, double>& numbers, uint64_t seed, uint64_t epoch, uint64_t index, int width,
            int height) {
  auto t = data::make_augment(augment_options("augmix", numbers, "imagenet", "", {}, 3));
  const auto& a = dynamic_cast<const data::AugMixTransform&>(*t);
  SampleRng rng(seed, epoch, index);
  const data::AugMixPlan p = a.plan(rng, width, height);
  std::vector<std::vector<std::tuple<std::string, int, double>>> chains;
  for (const auto& c : p.chains) {
    auto& out = chains.emplace_back();
    for (const auto& op : c) out.emplace_back(data::augment_op_name(op.op), op.bin, op.magnitude);
  }
  return {{p.m0, p.m1}, p.weights, chains};
}

// AutoAugment's sub-policies for `policy`: [((op, p, bin or None), (op, p, bin or None))].
py::list autoaugment_policy(const std::string& policy) {
  py::list out;
  for (const auto& sub : data::autoaugment_policy_table(policy)) {
    py::list steps;
    for (const auto& st : sub) {
      steps.append(py::make_tuple(data::augment_op_name(st.op), st.p, st.bin < 0 ? py::object(py::none()) : py::int_(st.bin)));
    }
    out.append(py::tuple(steps));
  }
  return out;
}

// magnitudes_fn(bins, height, width)[bin] of `op` in a policy's space (0 for ops without).
double augment_magnitude(const std::string& space_name, const std::string& op_name, int bins, int bin, int width,
                         int height) {
  data::AugmentSpace space;
  if (space_name == "trivialaugment_wide") space = data::AugmentSpace::kTrivialAugmentWide;
  else if (space_name == "randaugment") space = data::AugmentSpace::kRandAugment;
  else if (space_name == "autoaugment") space = data::AugmentSpace::kAutoAugment;
  else if (space_name == "augmix") space = data::AugmentSpace::kAugMix;
  else throw bad_input("no augmentation space \"{}\"", space_name);
  for (data::AugmentOp op : data::augment_space_ops(space)) {
    if (op_name != data::augment_op_name(op)) continue;
    return data::augment_op_has_magnitude(space, op) ? data::augment_magnitude(space, op, bins, bin, width, height) : 0.0;
  }
  throw bad_input("{} has no operation \"{}\"", space_name, op_name);
}

// A policy applied in place to one image as sample (seed, epoch, index) is.
void augment_image(py::buffer buffer, const std::string& name, const std::map<std::string, double>& numbers,
                   const std::string& policy, const std::string& interpolation, const std::vector<double>& fill,
                   uint64_t seed, uint64_t epoch, uint64_t index) {
  py::buffer_info info;
  const data::ImageRef img = chw_image(buffer, info);
  auto t = data::make_augment(augment_options(name, numbers, policy, interpolation, fill, img.channels));
  if (!t) return;
  py::gil_scoped_release release;
  SampleRng rng(seed, epoch, index);
  t->apply(img, rng);
}

// The training chain of sample transforms a job with `settings` (crucible keys, "data.solarize=0.5")
// runs, applied in place to one image as to sample (seed, epoch, index): what the loader does to
// a crop, for any registered transform. Returns the chain's phrases.
std::vector<std::string> sample_transforms_image(py::buffer buffer, const std::vector<std::string>& settings,
                                                 uint64_t seed, uint64_t epoch, uint64_t index) {
  py::buffer_info info;
  const data::ImageRef img = chw_image(buffer, info);
  data::DataConfig config;
  ConfigSchema schema;
  data::bind_data_config(config, schema);
  for (const auto& s : settings) schema.apply_override(s);
  data::ImageSpec spec;
  spec.type = data::SampleType::kPixels;
  spec.channels = img.channels;
  spec.height = img.height;
  spec.width = img.width;
  spec.order = img.channels == 3 ? data::ColorOrder::kRGB : data::ColorOrder::kGray;
  const data::SampleTransforms chain = data::training_transforms(config, spec);
  std::vector<std::string> phrases;
  for (const auto& t : chain) phrases.push_back(t->describe());
  py::gil_scoped_release release;
  SampleRng rng(seed, epoch, index);
  data::apply_transforms(chain, 0, img, rng);
  return phrases;
}

// ---- the draws of training's random transforms (tests/python/test_distributions.py) -------------

// RandomResizedCrop's draw for sample (epoch, index) of a training run with run.seed `seed`, of a
// width × height image, as the image pipeline makes it (the first draw of the sample's augment
// stream): torchvision's (top, left, height, width).
std::tuple<int, int, int, int> random_resized_crop_draw(uint64_t seed, uint64_t epoch, uint64_t index, int width,
                                                        int height, double scale_min, double scale_max,
                                                        double ratio_min, double ratio_max) {
  data::RandomResizedCropOptions o;
  o.scale_min = scale_min;
  o.scale_max = scale_max;
  o.ratio_min = ratio_min;
  o.ratio_max = ratio_max;
  SampleRng rng(derive_seed(seed, RngStream::kAugment), epoch, index);
  const data::Rect r = data::random_resized_crop(width, height, rng, o);
  return {r.y, r.x, r.height, r.width};
}

// Random erasing's draw for sample (epoch, index) of a run with run.seed `seed` (data::draw_erase):
// (top, left, height, width) of the erased rectangle, or None when it is left alone.
py::object erase_draw(uint64_t seed, int64_t epoch, int64_t index, double p, double scale_min, double scale_max,
                      double ratio_min, double ratio_max, int64_t width, int64_t height) {
  const data::EraseBox b =
      data::draw_erase(seed, epoch, index, p, scale_min, scale_max, ratio_min, ratio_max, width, height);
  if (!b.erase) return py::none();
  return py::make_tuple(b.top, b.left, b.h, b.w);
}

// MixUp/CutMix's draw for (step, rank) of a run with run.seed `seed` (data::draw_mix):
// ("none" | "mixup" | "cutmix", λ as drawn, λ used, (x1, y1, x2, y2), (rx, ry)).
py::tuple mix_draw(uint64_t seed, int64_t step, int64_t rank, double mixup_alpha, double cutmix_alpha, int64_t width,
                   int64_t height) {
  const data::MixDraw d = data::draw_mix(seed, step, rank, mixup_alpha, cutmix_alpha, width, height);
  const char* kind = d.kind == data::MixDraw::Kind::kMixUp ? "mixup" : d.kind == data::MixDraw::Kind::kCutMix ? "cutmix" : "none";
  return py::make_tuple(kind, d.lam_drawn, d.lam, py::make_tuple(d.box.x1, d.box.y1, d.box.x2, d.box.y2),
                        py::make_tuple(d.box.rx, d.box.ry));
}

// Batches grouped by aspect ratio (grouped_sampler.h), for tests/python/test_detection_grouping.py:
// over `base_order` when given (GroupedBatchSampler over that list: "order", "group_ids", "bins"),
// else the training order data.sampler gives (seed, epoch, rank of num_replicas, batch_size) with
// data.aspect_ratio_group_factor = factor, built as training builds it (-1: the sampler's own
// order): "order", "copies", "describe", and for grouped batches "group_ids" and "bins".
py::dict grouped_batches(const std::vector<double>& aspect_ratios, int64_t factor, int64_t batch_size,
                         const std::optional<std::vector<int64_t>>& base_order, const std::string& sampler,
                         uint64_t seed, int64_t epoch, int64_t num_replicas, int64_t rank) {
  py::dict out;
  if (base_order) {
    const std::vector<int64_t> groups = data::aspect_ratio_groups(aspect_ratios, factor);
    std::vector<int64_t> order = data::grouped_positions(*base_order, groups, batch_size);
    for (int64_t& p : order) p = (*base_order)[static_cast<size_t>(p)];
    out["order"] = order;
    out["group_ids"] = groups;
    out["bins"] = data::aspect_ratio_bins(factor);
    return out;
  }
  data::DataSettings settings("grouped_batches", "settings");
  settings.set("data.sampler=" + sampler);
  settings.set(fmt::format("data.aspect_ratio_group_factor={}", factor));
  data::SamplerBuild build(static_cast<int64_t>(aspect_ratios.size()), seed, {num_replicas, rank, false});
  build.batch = batch_size;
  build.aspect_ratios = aspect_ratios;
  const auto s = data::make_training_sampler(settings.data(), build);
  out["order"] = s->epoch_order(epoch);
  out["copies"] = s->epoch_copies(epoch);
  out["describe"] = s->describe();
  if (const auto* g = dynamic_cast<const data::GroupedBatchSampler*>(s.get())) {
    out["group_ids"] = g->group_ids();
    out["bins"] = data::aspect_ratio_bins(factor);
  }
  return out;
}

}  // namespace
}  // namespace crucible::python

PYBIND11_MODULE(_native, m) {
  using namespace crucible;
  using namespace crucible::python;
  m.doc() = "crucible's native loader and io layer (use the crucible package, not this module)";

  // bad input (a corrupt file, a bad setting) → ValueError; the environment failing → RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kBadInput) {
        PyErr_SetString(PyExc_ValueError, e.what());
      } else {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });

  py::class_<LoaderArgs>(m, "LoaderArgs")
      .def(py::init<>())
      .def_readwrite("source", &LoaderArgs::source)
      .def_readwrite("features", &LoaderArgs::features)
      .def_readwrite("labels", &LoaderArgs::labels)
      .def_readwrite("batch_size", &LoaderArgs::batch_size)
      .def_readwrite("rank", &LoaderArgs::rank)
      .def_readwrite("world_size", &LoaderArgs::world_size)
      .def_readwrite("train", &LoaderArgs::train)
      .def_readwrite("drop_last", &LoaderArgs::drop_last)
      .def_readwrite("nchw", &LoaderArgs::nchw)
      .def_readwrite("given_buffers", &LoaderArgs::given_buffers)
      .def_readwrite("defaults", &LoaderArgs::defaults)
      .def_readwrite("overrides", &LoaderArgs::overrides)
      .def_readwrite("options", &LoaderArgs::options);

  py::class_<NativeLoader>(m, "Loader")
      .def_static("images", &NativeLoader::images)
      .def_static("arrays", &NativeLoader::arrays)
      .def("batches_per_epoch", &NativeLoader::batches_per_epoch)
      .def("dataset_size", &NativeLoader::dataset_size)
      .def("samples_per_epoch", &NativeLoader::samples_per_epoch)
      .def("threads", &NativeLoader::threads)
      .def("seed", &NativeLoader::seed)
      .def("settings_json", &NativeLoader::settings_json)
      .def("not_applied", &NativeLoader::not_applied)
      .def("describe", &NativeLoader::describe)
      .def("threads_report", &NativeLoader::threads_report)
      .def("prefetch", &NativeLoader::prefetch)
      .def("batch_bytes", &NativeLoader::batch_bytes)
      .def("category_ids", &NativeLoader::category_ids)
      .def("class_names", &NativeLoader::class_names)
      .def("give", &NativeLoader::give)
      .def("free_buffers", &NativeLoader::free_buffers)
      .def("released", &NativeLoader::released)
      .def("start", &NativeLoader::start)
      .def("next", &NativeLoader::next);

  m.def(
      "coco_eval",
      [](const std::string& gt_path, const py::object& results) {
        const data::CocoGroundTruth gt = data::read_coco_ground_truth(gt_path);
        std::vector<data::CocoDetection> dets;
        if (py::isinstance<py::str>(results)) {
          dets = data::read_coco_results(results.cast<std::string>(), gt);
        } else {  // (image_id, category_id, x, y, w, h, score) rows
          for (const auto& row : results.cast<std::vector<std::vector<double>>>()) {
            if (row.size() != 7) throw bad_input("coco_eval: a detection row has {} values, expected 7", row.size());
            data::CocoDetection d;
            d.image_id = static_cast<int64_t>(row[0]), d.category_id = static_cast<int64_t>(row[1]);
            std::copy(row.begin() + 2, row.begin() + 6, d.bbox);
            d.score = row[6];
            dets.push_back(d);
          }
        }
        const data::CocoEvalResult r = data::coco_evaluate(gt, dets);
        py::dict out;
        out["stats"] = std::vector<double>(r.stats.begin(), r.stats.end());
        out["precision"] = r.precision;
        out["recall"] = r.recall;
        out["categories"] = r.categories;
        out["summary"] = r.summary();
        return out;
      },
      py::arg("ground_truth"), py::arg("results"),
      "COCOeval(iouType='bbox') of a results file (or rows of image_id, category_id, x, y, w, h, score) against "
      "a COCO instances file: {stats: the 12 numbers, precision [10, 101, K, 4, 3], recall [10, K, 4, 3], summary}");
  m.def("release_host_memory", [] { return release_freed_host_memory(); },
        "the freed heap glibc keeps (the loaders tune it to) back to the kernel; the resident bytes that went");
  m.def("detection_op", &detection_op,
        "one detection transform's operation on (uint8 [C, H, W], boxes, labels) given its parameters: "
        "(image, boxes, labels, ids of the kept input boxes)");
  m.def("detection_draw", &detection_draw, "the draws a detection transform makes for sample (seed, epoch, index)");
  m.def("detection_ops", [] { return data::detection_op_registry().names(); }, "the detection operations by name");
  m.def(
      "detection_keys",
      [] {
        data::DetectionSettings d;
        ConfigSchema s;
        declare_settings(s, d);
        std::vector<std::string> out;
        for (const ConfigKey* k : s.keys()) out.push_back(k->full_name());
        return out;
      },
      "the [data] keys of detection data (detection_presets.h), which only a detection loader applies");
  m.def("grouped_batches", &grouped_batches, py::arg("aspect_ratios"), py::arg("factor"), py::arg("batch_size"),
        py::arg("base_order") = py::none(), py::arg("sampler") = "distributed", py::arg("seed") = 0,
        py::arg("epoch") = 0, py::arg("num_replicas") = 1, py::arg("rank") = 0,
        "batches grouped by aspect ratio (GroupedBatchSampler) over a given order or data.sampler's, concatenated");
  m.def("image_op", &image_op, "one torchvision functional operation on a uint8 [C, H, W] array, in place");
  m.def("augment_magnitude", &augment_magnitude, "an operation's magnitude at a bin of a policy's space");
  m.def("augment_plan", &augment_plan, "the operations a policy draws for one sample");
  m.def("augmix_plan", &augmix_plan, "AugMix's draws for one sample: (m0, m1), chain weights, chains");
  m.def("autoaugment_policy", &autoaugment_policy, "AutoAugment's sub-policies of one policy, as torchvision lists them");
  m.def("sample_transforms_image", &sample_transforms_image,
        "the training chain of sample transforms a job with these settings runs, applied to one uint8 [C, H, W] array "
        "as to sample (seed, epoch, index)");
  m.def("data_keys", &data_keys, "every [data] key a job holds, with its default as TOML, in the schema's order");
  m.def("piece_arguments", &data::piece_arguments,
        "{keyword: \"data.key\"} of a sample transform's settings that mirror a library's keyword (augment: "
        "torchvision's num_ops, …)");
  m.def("augment_image", &augment_image, "a policy applied to one uint8 [C, H, W] array as to sample (seed, epoch, index)");
  m.def("random_resized_crop_draw", &random_resized_crop_draw,
        "RandomResizedCrop's (top, left, height, width) for sample (epoch, index) of a run with this run.seed");
  m.def("erase_draw", &erase_draw,
        "random erasing's (top, left, height, width) for sample (epoch, index) of a run with this run.seed, or None");
  m.def("mix_draw", &mix_draw,
        "MixUp/CutMix's draw for (step, rank) of a run with this run.seed: (kind, lam drawn, lam, box, centre)");
  m.def("load", &load, "arrays of an npy/npz/safetensors/.pt file as DLPack capsules");
  m.def("save", &save, "write (name, dtype, shape, bytes) arrays as safetensors, npy or npz");
  m.attr("version") = CRUCIBLE_VERSION;
}
