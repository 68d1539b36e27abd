// bind_data_config: the reference of every [data] key (defaults, allowed values, help).
#include "crucible/data/data_config.h"

#include "crucible/data/transforms/batch_settings.h"
#include "crucible/data/transforms/detection_presets.h"
#include "crucible/data/data_recipe.h"

namespace crucible::data {

void bind_data_config(DataConfig& c, ConfigSchema& s) {
  using DS = DataConfig::Dataset;
  s.add_enum("data", "dataset", &c.dataset,
             {{"idx", DS::kIdx}, {"arrays", DS::kArrays}, {"images", DS::kImages}, {"detection", DS::kDetection}},
             "data set kind: IDX files; arrays (.npy/.npz/.safetensors in the train_/test_ images/labels keys, "
             "\"file.npz:name\" picks one array); encoded images (JPEG/PNG); or detection: images with boxes (a COCO "
             "instances .json, a YOLO images folder, in data.train_path and data.test_path)");
  s.add("data", "train_images", &c.train_images, "training images (IDX, gzip or plain)");
  s.add("data", "train_labels", &c.train_labels, "training labels (IDX)");
  s.add("data", "test_images", &c.test_images, "test images (IDX), evaluated after every epoch");
  s.add("data", "test_labels", &c.test_labels, "test labels (IDX)");
  s.add("data", "train_path", &c.train_path,
        "images: training samples (image folder, tar shards, LMDB folder or packed index)");
  s.add("data", "test_path", &c.test_path, "images: test samples");
  s.add("data", "crop", &c.crop, "images: output side (RandomResizedCrop when training)").min(1);
  s.add("data", "eval_crop", &c.eval_crop,
        "images: the evaluation's centre crop (FixRes, --val-crop-size); 0 = data.crop").min(0);
  s.add("data", "eval_resize", &c.eval_resize,
        "images: the evaluation's short side before its centre crop (--val-resize-size); 0 = int(eval crop / 0.875)")
      .min(0);
  using CM = CacheMode;
  s.add_enum("data", "cache", &c.cache,
             {{"none", CM::kNone}, {"encoded", CM::kEncoded}, {"decoded", CM::kDecoded}},
             "images: RAM cache of encoded bytes or decoded pixels (D1)");
  s.add("data", "cache_mb", &c.cache_mb, "images: cache budget in MiB").non_negative();
  s.add("data", "jpeg_decode", &c.jpeg_decode,
        "images: JPEG decoding: fast integer IDCT + merged chroma upsampling, or libjpeg's accurate defaults")
      .choices({"fast", "accurate"});
  s.add("data", "jpeg_dct_scaling", &c.jpeg_dct_scaling,
        "images: decode a JPEG at the smallest DCT scale (1/8, 1/4, 1/2) that covers the output (D2); false: at full "
        "resolution, as torchvision");
  s.add("data", "exif_orientation", &c.exif_orientation,
        "images: turn JPEGs as their EXIF orientation tag says; false: stored orientation, as torchvision's decode_jpeg "
        "and PIL's Image.open");
  s.add("data", "color_order", &c.color_order, "channel order the pipeline delivers (D3)").choices({"RGB", "BGR"});
  s.add_enum("data", "bad_samples", &c.bad_samples,
             {{"fail", BadSamplePolicy::kFail}, {"skip", BadSamplePolicy::kSkip}},
             "a sample that fails to read or decode: stop, or skip and report (D5)");
  s.add("data", "train_samples", &c.train_samples,
        "use N training samples (0 = all): the first N of IDX files, N evenly spaced ones of images (every class in "
        "proportion); more than there are is an error")
      .non_negative();
  s.add("data", "test_samples", &c.test_samples,
        "use N test samples (0 = all): the first N of IDX files, N evenly spaced ones of images (every class in "
        "proportion); more than there are is an error")
      .non_negative();
  s.add("data", "sampler", &c.sampler,
        "the training order: distributed (PyTorch's DistributedSampler, X1); repeated (torchvision's RASampler: "
        "repeated augmentation, data.repeats copies of each sample, floor(n // 256 * 256 / world) samples a rank "
        "an epoch); global (one order at any world size, shuffled in windows of shards: elastic resume, streaming); "
        "auto: global for remote data, else distributed")
      .choices(sampler_registry().names());
  s.add("data", "mean", &c.mean, "per-channel mean for normalisation, in mean_std_range units");
  s.add("data", "std", &c.std, "per-channel std for normalisation, in mean_std_range units").positive();
  s.add("data", "mean_std_range", &c.mean_std_range,
        "units of mean/std: \"unit\" = pixels/255 (torchvision), \"byte\" = 0-255 (D4)")
      .choices({"unit", "byte"});
  s.add("data", "mean_std_order", &c.mean_std_order, "channel order of mean/std (D3)").choices({"RGB", "BGR"});
  s.add("data", "threads", &c.threads, "loader threads (0 = chosen: one per two cores for idx, measured for images)")
      .non_negative();
  s.add("data", "prefetch", &c.prefetch, "batches prepared ahead of training (bounds memory)").min(1);
  s.add("data", "cache_dir", &c.cache_dir,
        "remote data: the node's shard cache folder, shared by its ranks (\"\" = ~/.cache/crucible/shards)");
  s.add("data", "cache_bytes", &c.cache_bytes,
        "remote data: the shard cache's size in bytes, never exceeded (least recently used shards are evicted); "
        "best two shuffle windows of the largest shard, so the next window downloads while one is read")
      .min(1);
  s.add("data", "s3_endpoint", &c.s3_endpoint,
        "s3:// data from an S3-compatible store (MinIO, Ceph, R2, GCS): http(s)://host[:port], path-style; \"\" = AWS");
  s.add("data", "s3_region", &c.s3_region, "s3:// data: the region signed for (\"\" = AWS_REGION, else us-east-1)");
  s.add("data", "ca_bundle", &c.ca_bundle,
        "remote data over HTTPS: a PEM file of the authorities servers are verified by (a private CA); \"\" = the "
        "first set of AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE, else the system's");
  s.add("data", "remote_tries", &c.remote_tries,
        "remote data: attempts per request (5xx, timeouts, resets, truncated bodies) before the run stops").min(1);
  s.add("data", "remote_timeout", &c.remote_timeout, "remote data: seconds without a byte before a request is retried")
      .positive();
  s.add("data", "io_threads", &c.io_threads,
        "remote data: shards downloaded at once (range requests in parallel), apart from the decode threads").min(1);
  s.add("data", "remote_part_bytes", &c.remote_part_bytes,
        "remote data: the size of the range requests a shard is downloaded in, data.io_threads of them at once")
      .min(1);
  declare_data_piece_settings(c, s);  // the pieces' own keys, declared in their files
  declare_settings(s, c.pieces.of<DetectionSettings>(kDetectionPiece));  // detection's (detection_presets.h)
  declare_batch_transform_settings(c, s);  // and the device's batch transforms' (batch_settings.h)
}

void declare_batch_transform_settings(DataConfig& c, ConfigSchema& s) {
  declare_settings(s, c.pieces.of<RandomErasingOptions>(kRandomErasingPiece));
  declare_settings(s, c.pieces.of<MixUpCutMixOptions>(kMixUpCutMixPiece));
}

}  // namespace crucible::data
