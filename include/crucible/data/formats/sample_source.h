// Sources of encoded samples, random access by index (D1, D6, D11): an image folder with
// torchvision ImageFolder semantics, WebDataset-style tar shards, an LMDB database, and
// crucible's own packed shards, and an evenly spaced subset of any of them; for detection, a
// COCO instances file and a YOLO label folder. A sample is its stored bytes (JPEG, PNG or raw
// pixels) plus its label, or its boxes, and a name for reports (D5). Each format is a file of
// its own in src/data/formats/ and an entry in open_samples' list (sample_source.cpp).
// Thread-safe: get() may be called from many threads. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/image/boxes.h"

namespace crucible::data {

struct EncodedSample {
  const uint8_t* data = nullptr;  // valid while `hold` lives
  size_t size = 0;
  std::shared_ptr<const void> hold;
  int64_t label = -1;
  std::string name;  // file path, "shard.tar:key", LMDB key: what a report names
  // Detection: the sample's boxes, in pixels of the stored image (null for a classification
  // sample; empty for a background image), its image id in the source (COCO's) and the size
  // the source says the image has (0 when it does not say), which decoding must confirm.
  std::shared_ptr<const Boxes> boxes;
  int64_t image_id = -1;
  int width = 0, height = 0;
};

// What opening a path needs beyond the path: how a detection source treats its boxes, and
// where a COCO file's images are (empty: beside it, or COCO's own layout; see open_coco).
struct SourceOptions {
  BoxPolicy boxes;
  std::string images_root;
};

// What reading remote shards cost so far (remote_source.h): HTTP requests and retries, bytes,
// and the node's shard cache.
struct RemoteIo {
  int64_t requests = 0, retries = 0, bytes = 0;
  int64_t downloads = 0, hits = 0, evictions = 0, failed_checks = 0;
  int64_t cache_used_bytes = 0, cache_max_bytes = 0;
  std::string cache_dir;
  std::string credentials;  // where S3 credentials came from; empty for HTTP(S)
  std::string line() const;  // one line for the log
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // The sample at `index` (0 <= index < size()). Throws crucible::Error naming the sample when
  // it cannot be read (missing file, I/O error); decoding is the caller's business.
  virtual EncodedSample get(int64_t index) const = 0;
  // Class names by label (ImageFolder: the sorted sub-folder names).
  virtual const std::vector<std::string>& classes() const = 0;
  virtual std::string describe() const = 0;
  // D6: file descriptors held open for the source's lifetime, and opened (then closed) by one
  // get() call; the loader checks threads × per_read + held against `ulimit -n`.
  virtual int files_held() const { return 0; }
  virtual int files_per_read() const { return 0; }
  // Sharded sources: the number of samples in each shard, in index order (shard 0 holds indices
  // 0 … counts[0]-1, and so on); empty when the source is not sharded. The global order's
  // shuffle window (global_sampler.h) works in these.
  virtual std::vector<int64_t> shard_counts() const { return {}; }
  // The indices this process will read next, in order (the loader's epoch order from where it
  // starts): a remote source fetches their shards ahead on its I/O threads. Replaces the last plan.
  virtual void plan(const std::vector<int64_t>& upcoming) const {}
  // Remote reads so far (D11), false for local data.
  virtual bool remote_io(RemoteIo* out) const { return false; }
  // Detection: whether samples carry boxes; each label's id in the source (COCO's category ids,
  // which predictions are written back in; empty when labels are the ids); the image's
  // width and height by index without reading it (false when the source cannot say), which
  // batches grouped by aspect ratio use; and what the source did with bad boxes.
  virtual bool has_boxes() const { return false; }
  virtual std::vector<int64_t> category_ids() const { return {}; }
  virtual bool image_size(int64_t index, int* width, int* height) const { return false; }
  virtual BoxCounts box_counts() const { return {}; }
  // Whether decoding applies a JPEG's EXIF orientation to this source's images (with
  // data.exif_orientation): false where the boxes are in the stored pixels' frame, as COCO's
  // are (torchvision and pycocotools read the images through PIL, which does not rotate).
  virtual bool exif_orientation() const { return true; }
};

// A folder with one sub-folder per class; classes and files in sorted (byte) order, so labels
// equal torchvision's ImageFolder. Files with torchvision's IMG_EXTENSIONS (.jpg .jpeg .png
// .ppm .bmp .pgm .tif .tiff .webp, any case) are samples; others are ignored.
std::unique_ptr<SampleSource> open_image_folder(const std::string& root);

// WebDataset tar shards: consecutive members sharing a key (path up to the first '.' of the
// base name) form a sample; its image is the member with extension jpg/jpeg/png, its label the
// member cls/cls.txt/label/label.txt (a decimal integer). Random access through an offset
// index built on open, or read from "<shard>.idx" beside the shard when it matches. A built
// index is written there with the shard's SHA-256 (what a remote copy is verified by); an old
// one without the hash is rewritten with it where the folder takes writes.
// Detection (issue 47): a sample's "json" member holding an object with "boxes" is its target
// (json_target.h; a .json without "boxes" stays metadata); when any sample has one, every sample
// must, the targets are read on open under options.boxes, and the labels are their class indices.
std::unique_ptr<SampleSource> open_tar_shards(const std::vector<std::string>& shards, const SourceOptions& options = {});

// An LMDB environment (a folder holding data.mdb) whose values are u32 LE label followed by
// the encoded image, in key order; an optional "__classes__" key holds a JSON list of names.
std::unique_ptr<SampleSource> open_lmdb(const std::string& path);

// crucible's packed shards (see data/formats/pack.h): "<dst>/index.crpk" and its shard files, mapped.
// A detection set's targets are read per sample, under options.boxes.
std::unique_ptr<SampleSource> open_packed(const std::string& index_path, const SourceOptions& options = {});

// `n` samples of `base` spread evenly over it: sample i is base's sample i × size / n, so a
// source ordered by class (an image folder) keeps every class in proportion, and the subset is
// the same on every run. Forwards classes(), files_held() and files_per_read(); describe()
// names the subset. Throws bad_input naming both numbers when n < 1 or n > base->size().
std::unique_ptr<SampleSource> subset_evenly(std::shared_ptr<const SampleSource> base, int64_t n);

// The paths a shard list names: comma-separated parts, each expanded like WebDataset's
// braceexpand ("s3://b/train-{000000..000127}.tar"). bad_input for a malformed pattern.
std::vector<std::string> expand_shard_list(const std::string& list);

// A COCO instances file (images, annotations, categories; torchvision's CocoDetection over
// `images_root`): samples in increasing image id, as CocoDetection's sorted ids; each image's
// annotations in file order, xywh → xyxy in float32 as tv_tensors converts them; categories
// sorted by id become labels 0 … K-1 (category_ids() maps them back); iscrowd kept; an image
// without annotations is a background sample. The images are at options.images_root, else
// beside the file, else in COCO's layout (annotations/instances_<split>.json → <split>/).
// bad_input naming the file and the annotation id: an annotation whose image or category is
// not listed, a bad box under data.bad_boxes = "refuse", more than options.boxes.max_boxes boxes
// on one image, a field of the wrong type.
std::unique_ptr<SampleSource> open_coco(const std::string& json_path, const SourceOptions& options);

// A YOLO label folder as ultralytics and YOLOX users keep it: `images_dir` (…/images/<split>)
// holds the images (torchvision's IMG_EXTENSIONS, in path order), …/labels/<split> one .txt per
// image with lines "class cx cy w h" normalised to the image; no .txt, or an empty one, is a
// background image. Boxes become xyxy pixels with the image's size (read from its header);
// class names from classes.txt beside the images or labels folder (one per line), else numbered.
// bad_input naming the file and line: a line without 5 columns, a value that is no number, a
// class outside the names.
std::unique_ptr<SampleSource> open_yolo(const std::string& images_dir, const SourceOptions& options);

// Detects what `path` is — an image folder, an LMDB folder, a tar shard (or a comma-separated
// list / brace pattern "train-{000000..000009}.tar"), a packed index (file or folder holding
// index.crpk), a COCO instances .json, a YOLO images folder with its labels folder — and opens
// it. Throws bad_input saying what was found.
std::unique_ptr<SampleSource> open_samples(const std::string& path, const SourceOptions& options = {});

}  // namespace crucible::data
