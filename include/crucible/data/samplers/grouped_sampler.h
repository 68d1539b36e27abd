// Batches grouped by aspect ratio (detection; data.aspect_ratio_group_factor, train.py's
// --aspect-ratio-group-factor): GroupedBatchSampler equals torchvision's
// references/detection/group_by_aspect_ratio.py, GroupedBatchSampler(sampler,
// create_aspect_ratio_groups(dataset, k), batch_size), over the order another sampler gives.
// Every batch it yields holds images of one group (width / height between two neighbouring bins),
// so padding a batch to its largest image wastes little; and every batch is full (the groups left
// over at the end are topped up from their own samples), so the loader's consecutive cuts of the
// batch size give exactly its batches. Like every sampler, a pure function of (seed, epoch): a
// resumed run and any thread count see the same batches. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crucible/data/samplers/sampler.h"

namespace crucible::data {

class SamplePipeline;

// create_aspect_ratio_groups's bins for factor k >= 0: 2 ** np.linspace(-1, 1, 2k + 1), or
// [1.0] for k = 0, with numpy's arithmetic (i * step + start, the last one exactly 2). numpy's
// power of an array may round one of them the other way (its SIMD pow): no image side up to 65535
// gives an aspect ratio that the difference moves (tests/python/test_detection_grouping.py).
std::vector<double> aspect_ratio_bins(int64_t k);
// Each aspect ratio's group: how many bins are <= it (_quantize's bisect_right), 0 … bins.size().
// bad_input for a ratio that is not finite and positive.
std::vector<int64_t> aspect_ratio_groups(const std::vector<double>& aspect_ratios, int64_t k);

// GroupedBatchSampler's batches of `batch` over `order` (sample indices; group_ids by sample),
// concatenated, as positions into `order`: a position appears again where a leftover group is
// topped up with its own samples. len(order) // batch batches.
std::vector<int64_t> grouped_positions(const std::vector<int64_t>& order, const std::vector<int64_t>& group_ids,
                                       int64_t batch);

// Width / height of each sample of a detection pipeline, from its source's image sizes
// (SampleSource::image_size: COCO's JSON, YOLO's image headers) without reading an image —
// _compute_aspect_ratios_coco_dataset's float(width) / float(height). Empty for another pipeline or
// a source that cannot tell (the batches are then not grouped).
std::vector<double> aspect_ratios_of(const SamplePipeline& pipeline);

class GroupedBatchSampler final : public Sampler {
 public:
  // Groups `base`'s order by the samples' aspect ratios (`aspect_ratios`, one per sample of the
  // data set) with factor `factor` (>= 0) into batches of batch × part.num_replicas, and yields
  // part.rank's slice of each, `batch` samples. One part (the default): torchvision's batches
  // themselves, over this rank's order (DistributedSampler, RASampler). Several: the global order
  // (global_sampler.h), grouped as one before the ranks split each global batch, so that a step's
  // samples stay the same at any world size. bad_input for a bad factor, batch, part or ratio,
  // and where the base gives fewer samples than one batch (torchvision would give no batch).
  GroupedBatchSampler(std::shared_ptr<const Sampler> base, std::vector<double> aspect_ratios, int64_t factor,
                      int64_t batch, Shard part = {});

  int64_t size() const override { return base_->size(); }
  int64_t num_samples() const override { return batches_ * batch_; }
  std::vector<int64_t> epoch_order(int64_t epoch) const override;
  // A top-up visits a sample the epoch has served already; torchvision draws its augmentation
  // afresh, so it is a copy of its own: the base's copy number plus kTopUpCopy per earlier visit.
  std::vector<int64_t> epoch_copies(int64_t epoch) const override;
  std::string describe() const override;

  const Sampler& base() const { return *base_; }
  const std::vector<int64_t>& group_ids() const { return groups_; }
  int64_t groups_used() const { return groups_used_; }  // groups holding at least one sample

  // Past every copy number a base sampler gives (RASampler's data.repeats).
  static constexpr int64_t kTopUpCopy = int64_t{1} << 16;

 private:
  // Every part's grouped batches as positions into `*order` (the base's order of `epoch`, filled).
  std::vector<int64_t> all_positions(int64_t epoch, std::vector<int64_t>* order) const;
  // This part's slice of each grouped batch.
  std::vector<int64_t> part_of(std::vector<int64_t> all) const;

  std::shared_ptr<const Sampler> base_;
  int64_t factor_;
  int64_t batch_;
  Shard part_;
  std::vector<int64_t> groups_;
  int64_t groups_used_ = 0;
  int64_t batches_ = 0;
};

}  // namespace crucible::data
