// GroupedBatchSampler: torchvision's references/detection/group_by_aspect_ratio.py in C++, its
// Python semantics kept where they decide a batch — the groups' dict order (a group's key goes
// last when its batch is yielded: `del`, then the assert's lookup puts it back), the stable sort
// of the leftovers by size, the top-up cycling through the group's own samples. The suite checks
// the batches against that file itself (tests/python/test_detection_grouping.py).
#include "crucible/data/samplers/grouped_sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "crucible/data/loader/detection_pipeline.h"

namespace crucible::data {
namespace {

// More groups than any data set's aspect ratios fill; a guard against a typo's memory.
constexpr int64_t kMaxFactor = 1000;

void check_factor(int64_t k) {
  if (k < 0 || k > kMaxFactor) {
    throw bad_input("data.aspect_ratio_group_factor: grouping by aspect ratio takes a factor k in [0, {}] (2k + 1 "
                    "bins from 1/2 to 2; -1 turns grouping off), found {}",
                    kMaxFactor, k);
  }
}

// One group of GroupedBatchSampler.__iter__: buffer_per_group's list, samples_per_group's, and
// where its key stands in buffer_per_group's insertion order (-1: not in the dict).
struct Group {
  std::vector<int64_t> buffer, samples;
  int64_t key = -1;
};

// The end of __iter__: the leftover groups, largest first (sorted() is stable: ties keep the
// dict's order), each topped up from its own samples, cycled, until len(sampler) // batch_size.
void top_up(std::vector<Group>& groups, int64_t remaining, int64_t batch, std::vector<int64_t>* out) {
  std::vector<size_t> ids;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].key >= 0) ids.push_back(g);
  }
  std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) { return groups[a].key < groups[b].key; });
  std::stable_sort(ids.begin(), ids.end(),
                   [&](size_t a, size_t b) { return groups[a].buffer.size() > groups[b].buffer.size(); });
  for (const size_t g : ids) {
    if (remaining == 0) break;
    const Group& group = groups[g];
    out->insert(out->end(), group.buffer.begin(), group.buffer.end());
    const size_t need = static_cast<size_t>(batch) - group.buffer.size();
    for (size_t i = 0; i < need; ++i) out->push_back(group.samples[i % group.samples.size()]);
    --remaining;
  }
}

}  // namespace

std::vector<double> aspect_ratio_bins(int64_t k) {
  check_factor(k);
  if (k == 0) return {1.0};
  // np.linspace(-1, 1, 2k + 1): step = delta / div, y = arange(num) * step, y += start, y[-1] = stop.
  const int64_t num = 2 * k + 1;
  const double step = 2.0 / static_cast<double>(num - 1);
  std::vector<double> bins(static_cast<size_t>(num));
  for (int64_t i = 0; i < num; ++i) {
    volatile double scaled = static_cast<double>(i) * step;  // rounded before the sum, as numpy's two passes
    const double y = i == num - 1 ? 1.0 : scaled + -1.0;
    bins[static_cast<size_t>(i)] = std::pow(2.0, y);
  }
  return bins;
}

std::vector<int64_t> aspect_ratio_groups(const std::vector<double>& aspect_ratios, int64_t k) {
  const std::vector<double> bins = aspect_ratio_bins(k);
  std::vector<int64_t> groups(aspect_ratios.size());
  for (size_t i = 0; i < aspect_ratios.size(); ++i) {
    const double r = aspect_ratios[i];
    if (!std::isfinite(r) || r <= 0) {
      throw bad_input("batches grouped by aspect ratio: sample {} has aspect ratio {} (width / height); expected a "
                      "finite positive number",
                      i, r);
    }
    groups[i] = std::upper_bound(bins.begin(), bins.end(), r) - bins.begin();  // bisect_right
  }
  return groups;
}

std::vector<int64_t> grouped_positions(const std::vector<int64_t>& order, const std::vector<int64_t>& group_ids,
                                       int64_t batch) {
  if (batch < 1) throw bad_input("batches grouped by aspect ratio: the batch size must be >= 1, found {}", batch);
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n / batch * batch));
  std::vector<Group> groups;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t index = order[static_cast<size_t>(p)];
    if (index < 0 || index >= static_cast<int64_t>(group_ids.size())) {
      throw bad_input("batches grouped by aspect ratio: the order holds sample {}, outside the {} samples grouped",
                      index, group_ids.size());
    }
    if (group_ids[static_cast<size_t>(index)] < 0) {
      throw bad_input("batches grouped by aspect ratio: sample {} has group {}; groups are numbered from 0", index,
                      group_ids[static_cast<size_t>(index)]);
    }
    const auto g = static_cast<size_t>(group_ids[static_cast<size_t>(index)]);
    if (g >= groups.size()) groups.resize(g + 1);
    Group& group = groups[g];
    if (group.key < 0) group.key = p;  // the first append inserts the key
    group.buffer.push_back(p);
    group.samples.push_back(p);
    if (static_cast<int64_t>(group.buffer.size()) == batch) {
      out.insert(out.end(), group.buffer.begin(), group.buffer.end());
      group.buffer.clear();
      group.key = p;  // `del buffer_per_group[g]`, then the assert's lookup inserts it again, last
    }
  }
  top_up(groups, n / batch - static_cast<int64_t>(out.size()) / batch, batch, &out);
  return out;
}

std::vector<double> aspect_ratios_of(const SamplePipeline& pipeline) {
  const auto* detection = dynamic_cast<const DetectionPipeline*>(&pipeline);
  if (detection == nullptr) return {};
  const SampleSource& source = detection->source();
  std::vector<double> ratios(static_cast<size_t>(source.size()));
  for (int64_t i = 0; i < source.size(); ++i) {
    int width = 0, height = 0;
    if (!source.image_size(i, &width, &height)) return {};
    if (width <= 0 || height <= 0) {
      throw bad_input("{}: sample {} is {}x{} pixels; grouping batches by aspect ratio needs a positive width and "
                      "height (data.aspect_ratio_group_factor = -1 turns it off)",
                      source.describe(), i, width, height);
    }
    ratios[static_cast<size_t>(i)] = static_cast<double>(width) / static_cast<double>(height);
  }
  return ratios;
}

GroupedBatchSampler::GroupedBatchSampler(std::shared_ptr<const Sampler> base, std::vector<double> aspect_ratios,
                                         int64_t factor, int64_t batch, Shard part)
    : base_(std::move(base)), factor_(factor), batch_(batch), part_(part) {
  if (!base_) throw std::invalid_argument("GroupedBatchSampler: no base sampler");
  if (batch_ < 1) throw bad_input("batches grouped by aspect ratio: the batch size must be >= 1, found {}", batch_);
  if (part_.num_replicas < 1 || part_.rank < 0 || part_.rank >= part_.num_replicas) {
    throw bad_input("batches grouped by aspect ratio: part {} of {} does not exist", part_.rank, part_.num_replicas);
  }
  if (static_cast<int64_t>(aspect_ratios.size()) != base_->size()) {
    throw bad_input("batches grouped by aspect ratio: {} aspect ratios for a data set of {} samples",
                    aspect_ratios.size(), base_->size());
  }
  groups_ = aspect_ratio_groups(aspect_ratios, factor_);
  std::vector<bool> used(aspect_ratio_bins(factor_).size() + 1, false);
  for (const int64_t g : groups_) used[static_cast<size_t>(g)] = true;
  groups_used_ = std::count(used.begin(), used.end(), true);
  const int64_t whole = batch_ * part_.num_replicas;
  batches_ = base_->num_samples() / whole;
  if (batches_ == 0) {
    throw bad_input("batches grouped by aspect ratio (data.aspect_ratio_group_factor = {}): the order gives {} "
                    "samples an epoch, fewer than one batch of {}, so torchvision's GroupedBatchSampler would give no "
                    "batch; use a smaller batch, more samples or data.aspect_ratio_group_factor = -1",
                    factor_, base_->num_samples(), whole);
  }
}

std::vector<int64_t> GroupedBatchSampler::all_positions(int64_t epoch, std::vector<int64_t>* order) const {
  *order = base_->epoch_order(epoch);
  std::vector<int64_t> all = grouped_positions(*order, groups_, batch_ * part_.num_replicas);
  if (static_cast<int64_t>(all.size()) != batches_ * batch_ * part_.num_replicas) {
    throw std::logic_error(fmt::format("GroupedBatchSampler: {} grouped positions for {} batches of {}", all.size(),
                                       batches_, batch_ * part_.num_replicas));
  }
  return all;
}

std::vector<int64_t> GroupedBatchSampler::part_of(std::vector<int64_t> all) const {
  if (part_.num_replicas == 1) return all;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(batches_ * batch_));
  for (int64_t j = 0; j < batches_; ++j) {
    const auto begin = all.begin() + (j * part_.num_replicas + part_.rank) * batch_;
    mine.insert(mine.end(), begin, begin + batch_);
  }
  return mine;
}

std::vector<int64_t> GroupedBatchSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order;
  std::vector<int64_t> mine = part_of(all_positions(epoch, &order));
  for (int64_t& p : mine) p = order[static_cast<size_t>(p)];
  return mine;
}

std::vector<int64_t> GroupedBatchSampler::epoch_copies(int64_t epoch) const {
  std::vector<int64_t> order;
  std::vector<int64_t> all = all_positions(epoch, &order);
  const std::vector<int64_t> base = base_->epoch_copies(epoch);
  // Visits are counted over every part's batches, so that the ranks sharing a global order
  // number a sample's top-ups alike.
  std::vector<int64_t> visits(order.size(), 0);
  for (int64_t& slot : all) {
    const auto p = static_cast<size_t>(slot);
    const int64_t copy = base.empty() ? 0 : base.at(p);
    if (copy >= kTopUpCopy) {
      throw std::logic_error(fmt::format("GroupedBatchSampler: the base sampler numbers a copy {} (>= {})", copy,
                                         kTopUpCopy));
    }
    slot = copy + visits[p]++ * kTopUpCopy;  // the position's copy number replaces it
  }
  std::vector<int64_t> mine = part_of(std::move(all));
  if (std::all_of(mine.begin(), mine.end(), [](int64_t c) { return c == 0; })) return {};  // all first copies
  return mine;
}

std::string GroupedBatchSampler::describe() const {
  return fmt::format("{}; batches grouped by aspect ratio into {} groups (factor {}){}: {} batches of {} an epoch",
                     base_->describe(), groups_used_, factor_,
                     part_.num_replicas > 1 ? fmt::format(", each global batch of {} split over {} ranks",
                                                          batch_ * part_.num_replicas, part_.num_replicas)
                                            : "",
                     batches_, batch_);
}

}  // namespace crucible::data
