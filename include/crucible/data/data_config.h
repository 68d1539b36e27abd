// The [data] section of a job: where the samples come from, how they are decoded, ordered,
// normalised and loaded, and the settings each data piece (a sample transform, a sampler)
// declares in its own file, held in `pieces`. bind_data_config() registers every key with its
// help and allowed values, so training and the data commands (`crucible bench loader`, the
// Python loaders) read the same keys the same way without the train layer. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crucible/core/config.h"
#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"

namespace crucible::data {

struct DataConfig {
  // idx: IDX image + label files; arrays: .npy/.npz/.safetensors features + labels in the same
  // four keys; images: encoded images (train_path/test_path); detection: images with boxes
  // (train_path/test_path: a COCO instances file, a YOLO images folder)
  enum class Dataset { kIdx, kArrays, kImages, kDetection };
  Dataset dataset = Dataset::kIdx;
  std::string train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  std::string train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";
  std::string test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
  std::string test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  std::string train_path;     // "images": an image folder, tar shards, an LMDB folder or a packed index
  std::string test_path;
  int64_t crop = 224;         // "images": output size (RandomResizedCrop for training, centre crop for tests)
  // FixRes (torchvision's --train-crop-size 176, --val-resize-size 232, --val-crop-size 224): the
  // evaluation's crop and short side, apart from the training crop. 0: crop, and int(crop / 0.875).
  int64_t eval_crop = 0;
  int64_t eval_resize = 0;
  CacheMode cache = CacheMode::kNone;  // images: none | encoded | decoded (D1)
  int64_t cache_mb = 0;       // budget of that cache
  std::string jpeg_decode = "fast";  // "fast" (fast IDCT, merged upsampling) | "accurate"
  bool jpeg_dct_scaling = true;  // decode a JPEG at the smallest DCT scale that covers the output (D2)
  bool exif_orientation = true;  // turn photos as their EXIF orientation tag says
  std::string color_order = "RGB";  // D3: channel order the pipeline delivers ("BGR" only when asked)
  BadSamplePolicy bad_samples = BadSamplePolicy::kFail;  // D5: fail | skip
  int64_t train_samples = 0;  // 0 = all
  int64_t test_samples = 0;   // 0 = all
  std::string sampler = "auto";  // the training order (data_recipe.cpp's sampler registry)
  std::vector<double> mean = {0.2860};
  std::vector<double> std = {0.3530};
  std::string mean_std_range = "unit";  // D4: the units of mean/std: "unit" (0-1) or "byte" (0-255)
  std::string mean_std_order = "RGB";   // D3: the channel order mean/std are listed in
  int64_t threads = 0;                  // loader threads; 0 = 1 per 2 cores, at least 1
  int64_t prefetch = 4;
  // Remote data (train_path/test_path of s3://, http://, https://; remote_source.h, issue 37)
  std::string cache_dir;                  // the node's shard cache; "" = $XDG_CACHE_HOME or ~/.cache, /crucible/shards
  int64_t cache_bytes = int64_t{16} << 30;  // never exceeded; least recently used shards are evicted
  std::string s3_endpoint;                // S3-compatible stores (MinIO, Ceph, R2, GCS): http(s)://host[:port]
  std::string s3_region;                  // "" = AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
  std::string ca_bundle;                  // HTTPS: a PEM file of authorities; "" = AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE, the system's
  int64_t remote_tries = 5;               // attempts per request before the run stops (exit 1)
  double remote_timeout = 30;             // seconds without a byte before a request is retried
  int64_t io_threads = 4;                 // shards downloaded at once, apart from the decode threads
  int64_t remote_part_bytes = int64_t{8} << 20;  // the range requests a shard is downloaded in
  // The settings of the registered data pieces (data_recipe.h: sample transforms, samplers), each
  // declared in the piece's own file, by the piece's name.
  PieceOptions pieces;
};

// Registers every [data] key of `config` in `schema` (config must outlive schema): the section's
// own keys, then each registered data piece's (data_recipe.h).
void bind_data_config(DataConfig& config, ConfigSchema& schema);

}  // namespace crucible::data
