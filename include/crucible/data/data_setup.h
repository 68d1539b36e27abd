// Builds the data pipelines a [data] section describes (data_config.h): IDX files held in RAM,
// array files (.npy/.npz/.safetensors) read from their memory map, or encoded images from any
// sample source. Shared by training's assembly and the data commands (`crucible bench loader`,
// the Python loaders), so a benchmark measures exactly what training runs. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "crucible/data/loader/loader.h"
#include "crucible/data/loader/pipeline.h"
#include "crucible/data/remote/remote_source.h"
#include "crucible/data/data_config.h"

namespace crucible::data {

struct CocoGroundTruth;

struct DataSetup {
  std::shared_ptr<const SamplePipeline> train;  // training transforms (flip / RandomResizedCrop)
  std::shared_ptr<const SamplePipeline> test;   // evaluation transforms (none / centre crop)
  int64_t num_classes = 0;
  // Detection: the test split's ground truth for COCO's numbers. A COCO file's is read as
  // pycocotools reads it (its "area", crowd regions); another source's (YOLO, packed) is its
  // samples' boxes, area w × h. Null for classification.
  std::shared_ptr<const CocoGroundTruth> test_truth;
};

// Reads `config`: "idx" loads the four IDX files; "arrays" opens the same four keys as array
// files ("file.npz:name" picks one of several arrays), logs their dtype, shape and value range
// and warns of float features that look un-normalised (D4); "images" opens train_path and
// test_path. data.train_samples / data.test_samples (N > 0) keep the first N samples of IDX
// and array files and N evenly spaced samples of an image source (every class in proportion);
// an N larger than the data holds is bad_input naming the key and both numbers. Training and
// test samples of another shape or type are bad_input naming both files.
// `test_only` (eval, predict): the training keys are not read; `train` is the test pipeline and
// num_classes the test data's.
DataSetup make_data(const DataConfig& config, uint64_t augment_seed, bool test_only = false);

// The training pipeline over `path` for `crucible bench loader`: a folder holding
// train-images-idx3-ubyte(.gz) + train-labels-idx1-ubyte(.gz) is IDX; anything else goes to
// open_samples (image folder, tar shards, LMDB, packed index). data.train_samples limits
// either kind as in make_data (whether `train` or not).
std::shared_ptr<const SamplePipeline> make_pipeline_for_path(const std::string& path, const DataConfig& config,
                                                                   uint64_t augment_seed, bool train);

// The remote source's options from [data] (cache folder resolved, the environment's credentials;
// the training split keeps a shuffle window of shards pinned).
RemoteSourceOptions remote_source_options(const DataConfig& config, bool train);

// open_samples, or open_remote_samples for an s3:// or http(s):// path.
std::unique_ptr<SampleSource> open_data_path(const std::string& path, const DataConfig& config, bool train);

// Loader options from `config` (threads resolved by the caller: data.threads, or chosen).
LoaderOptions loader_options(const DataConfig& config, int64_t batch_size, int threads);

}  // namespace crucible::data
