// Law 1 / D5 / D8 / D10: batches are identical for 1 and 4 threads, flips come from the
// sample's own stream, a resumed position continues the same epoch, worker errors reach the
// consumer, bad samples are skipped (named, counted) or fail the run naming the sample, every
// epoch runs on the same worker threads, and the thread count is chosen from measured rates.
// To add a case: build a Loader over an InMemorySource (make_source) or a small fake
// SamplePipeline that records or delays what it needs, and check the batches, never a timing.
#include "crucible/data/loader/loader.h"
#include "crucible/data/samplers/repeated_sampler.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "crucible/core/error.h"
#include "test_util.h"

namespace crucible::data {
namespace {

std::shared_ptr<InMemorySource> make_source(int64_t n) {
  ImageSpec spec{4, 5, 1, ColorOrder::kGray, ValueRange::kByte};
  std::vector<uint8_t> px(static_cast<size_t>(n * 20));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 131) % 251);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i % 10;
  return std::make_shared<InMemorySource>(spec, px, labels, "test");
}

std::vector<Batch> epoch(Loader& l, int64_t e, int64_t first = 0) {
  std::vector<Batch> out;
  l.start_epoch(e, first);
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

LoaderOptions opts(int threads) {
  LoaderOptions o;
  o.batch_size = 32;
  o.threads = threads;
  o.prefetch = 3;
  return o;
}

std::shared_ptr<const SamplePipeline> flipping(std::shared_ptr<const Source> src) {
  return std::make_shared<ArrayPipeline>(std::move(src), test::flip(0.5f), 99);
}

// Repeated augmentation (data.sampler = "repeated"): each copy of a sample draws its own
// augmentation (here the flip), keyed on (epoch, index, copy); a first copy draws exactly what
// the sample draws under the ordinary sampler, and the batches stay the same for 1 and 4 threads.
TEST(Loader, RepeatedCopiesDrawTheirOwnAugmentationFirstCopiesAsEver) {
  auto src = make_source(1000);
  const RepeatedAugmentationSampler ra(1000, true, 5, 3, Sampler::Shard{});
  Loader one(flipping(src), std::make_shared<const RepeatedAugmentationSampler>(ra), opts(1));
  Loader four(flipping(src), std::make_shared<const RepeatedAugmentationSampler>(ra), opts(4));
  auto a = epoch(one, 2), b = epoch(four, 2);
  ASSERT_EQ(a.size(), b.size());
  const size_t sample_bytes = 20;
  std::map<int64_t, std::vector<std::string>> copies;  // sample → the pixels of its copies, in order
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].pixels, b[i].pixels) << "batch " << i;
    EXPECT_EQ(a[i].copies, b[i].copies);
    ASSERT_EQ(a[i].copies.size(), a[i].sample_ids.size());
    for (size_t k = 0; k < a[i].sample_ids.size(); ++k) {
      auto& v = copies[a[i].sample_ids[k]];
      EXPECT_EQ(a[i].copies[k], static_cast<int64_t>(v.size()));  // copies 0, 1, 2 in order
      v.emplace_back(reinterpret_cast<const char*>(a[i].pixels.data()) + k * sample_bytes, sample_bytes);
    }
  }
  // The ordinary sampler's draw for (epoch 2, index) is the first copy's.
  Loader plain(flipping(src), DistributedSampler(1000, false, 0), opts(2));
  std::map<int64_t, std::string> first;
  for (const Batch& batch : epoch(plain, 2)) {
    for (size_t k = 0; k < batch.sample_ids.size(); ++k) {
      first[batch.sample_ids[k]].assign(reinterpret_cast<const char*>(batch.pixels.data()) + k * sample_bytes,
                                        sample_bytes);
    }
  }
  int differ = 0, full = 0;
  for (const auto& [id, v] : copies) {
    EXPECT_EQ(v[0], first[id]) << "sample " << id;
    if (v.size() < 3) continue;
    ++full;
    differ += v[0] != v[1] || v[1] != v[2];
  }
  EXPECT_EQ(full, 256);
  // Three independent flips of p = 0.5 agree with probability 1/4: about 192 of 256 differ
  // (identical draws for the copies would give 0).
  EXPECT_GT(differ, 150);
  EXPECT_LT(differ, 230);
}

// Law 1: thread timing never changes what a batch holds.
TEST(Loader, SameBatchesForOneAndFourThreads) {
  auto src = make_source(1000);
  Loader one(flipping(src), DistributedSampler(1000, true, 5), opts(1));
  Loader four(flipping(src), DistributedSampler(1000, true, 5), opts(4));
  for (int64_t e : {0, 1}) {
    auto a = epoch(one, e), b = epoch(four, e);
    ASSERT_EQ(a.size(), 32u);  // 31 full batches and one of 8
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(a.back().size(), 8);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].sample_ids, b[i].sample_ids);
      EXPECT_EQ(a[i].pixels, b[i].pixels) << "epoch " << e << " batch " << i;
      EXPECT_EQ(a[i].labels, b[i].labels);
    }
  }
}

TEST(Loader, FlipsAboutHalfAndMirrorsRows) {
  auto src = make_source(400);
  Loader l(flipping(src), DistributedSampler(400, false, 0), opts(2));
  int flipped = 0;
  for (const auto& b : epoch(l, 0)) {
    for (int64_t k = 0; k < b.size(); ++k) {
      const uint8_t* in = src->pixels(b.sample_ids[k]);
      const uint8_t* out = b.pixels.data() + k * 20;
      bool same = std::equal(in, in + 20, out);
      bool mirrored = true;
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 5; ++x) mirrored &= out[y * 5 + x] == in[y * 5 + (4 - x)];
      EXPECT_TRUE(same || mirrored);
      flipped += same ? 0 : 1;
    }
  }
  EXPECT_GT(flipped, 150);
  EXPECT_LT(flipped, 250);
}

TEST(Loader, ResumedPositionContinuesTheEpoch) {
  auto src = make_source(500);
  Loader l(flipping(src), DistributedSampler(500, true, 3), opts(3));
  auto full = epoch(l, 2);
  auto tail = epoch(l, 2, 5);
  ASSERT_EQ(tail.size(), full.size() - 5);
  for (size_t i = 0; i < tail.size(); ++i) {
    EXPECT_EQ(tail[i].index, full[i + 5].index);
    EXPECT_EQ(tail[i].pixels, full[i + 5].pixels);
  }
}

TEST(Loader, RestartingMidEpochDiscardsBatchesInFlight) {
  auto src = make_source(2000);
  Loader l(flipping(src), DistributedSampler(2000, true, 3), opts(4));
  l.start_epoch(0);
  l.next();  // leave prefetched batches of epoch 0 in flight
  auto e1 = epoch(l, 1);
  Loader fresh(flipping(src), DistributedSampler(2000, true, 3), opts(1));
  auto expect = epoch(fresh, 1);
  ASSERT_EQ(e1.size(), expect.size());
  for (size_t i = 0; i < e1.size(); ++i) EXPECT_EQ(e1[i].pixels, expect[i].pixels);
}

class FailingSource : public Source {
 public:
  int64_t size() const override { return 100; }
  ImageSpec spec() const override { return ImageSpec{2, 2, 1, ColorOrder::kGray, ValueRange::kByte}; }
  const uint8_t* pixels(int64_t i) const override {
    if (i == 57) throw std::runtime_error("sample 57 is unreadable");
    return px_;
  }
  int64_t label(int64_t) const override { return 0; }
  int64_t num_classes() const override { return 1; }
  std::string describe() const override { return "failing"; }

 private:
  uint8_t px_[4] = {1, 2, 3, 4};
};

TEST(Loader, WorkerErrorReachesTheConsumer) {
  Loader l(flipping(std::make_shared<FailingSource>()), DistributedSampler(100, false, 0), opts(2));
  l.start_epoch(0);
  int ok = 0;
  try {
    while (l.next()) ++ok;
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "sample 57 is unreadable");
  }
  EXPECT_EQ(ok, 1);  // batch 0 (samples 0–31) fine, batch 1 holds sample 57
}

// X1: the ranks' loaders of one epoch split the data set between them — disjoint shards that
// cover it when the size divides evenly, every sample plus DistributedSampler's padding (the
// start of the epoch's order repeated) when it does not, and the tail dropped with drop_last.
TEST(Loader, RanksCoverTheDataSetInDisjointShardsX1) {
  for (int64_t n : {1000, 1003}) {
    for (bool drop : {false, true}) {
      const int64_t world = 4;
      auto src = make_source(n);
      const std::vector<int64_t> full = DistributedSampler(n, true, 7).epoch_order(2);
      std::vector<int64_t> seen;
      for (int64_t rank = 0; rank < world; ++rank) {
        Loader l(flipping(src), DistributedSampler(n, true, 7, Sampler::Shard{world, rank, drop}), opts(2));
        const int64_t share = drop ? n / world : (n + world - 1) / world;
        EXPECT_EQ(l.sampler().num_samples(), share);
        EXPECT_EQ(l.batches_per_epoch(), (share + 31) / 32);
        int64_t count = 0;
        for (const auto& b : epoch(l, 2)) {
          for (int64_t k = 0; k < b.size(); ++k) {
            EXPECT_EQ(b.labels[k], b.sample_ids[k] % 10);
            seen.push_back(b.sample_ids[k]);
          }
          count += b.size();
        }
        EXPECT_EQ(count, share) << "n=" << n << " rank " << rank;
      }
      std::vector<int64_t> expect(full.begin(), full.end());
      if (n % world != 0 && !drop) expect.push_back(full[0]);  // 1003 → 1004: one padded index
      if (n % world != 0 && drop) {  // 1003 → 1000: the last 3 of the order are nobody's
        expect.assign(full.begin(), full.end() - 3);
      }
      std::sort(seen.begin(), seen.end());
      std::sort(expect.begin(), expect.end());
      EXPECT_EQ(seen, expect) << "n=" << n << " drop_last=" << drop;
      if (n % world == 0) {
        EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "shards overlap";
      }
    }
  }
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

// Records the kernel thread id (gettid: never reused while the thread lives, unlike
// std::thread::id values) of every thread that produces a sample, per epoch.
class ThreadRecordingPipeline : public SamplePipeline {
 public:
  explicit ThreadRecordingPipeline(std::shared_ptr<const SamplePipeline> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  ImageSpec output_spec() const override { return inner_->output_spec(); }
  int64_t produce(int64_t index, int64_t epoch, uint8_t* dst) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tids_[epoch].insert(static_cast<int64_t>(::syscall(SYS_gettid)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // batches overlap: several workers run
    return inner_->produce(index, epoch, dst);
  }
  std::string describe() const override { return "recording " + inner_->describe(); }
  std::set<int64_t> tids(int64_t epoch) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tids_.find(epoch);
    return it == tids_.end() ? std::set<int64_t>{} : it->second;
  }

 private:
  std::shared_ptr<const SamplePipeline> inner_;
  mutable std::mutex mu_;
  mutable std::map<int64_t, std::set<int64_t>> tids_;  // guarded by mu_
};

TEST(Loader, OnePersistentPoolAcrossEpochsD8) {
  auto recording = std::make_shared<ThreadRecordingPipeline>(flipping(make_source(300)));
  Loader l(recording, DistributedSampler(300, true, 1), opts(3));
  for (int e = 0; e < 6; ++e) epoch(l, e);
  const std::set<int64_t> first = recording->tids(0);
  EXPECT_GT(first.size(), 1u) << "epoch 0 ran on one thread only";
  EXPECT_LE(first.size(), 3u);
  for (int e = 1; e < 6; ++e) {
    const std::set<int64_t> now = recording->tids(e);
    EXPECT_FALSE(now.empty());
    for (int64_t tid : now) {
      EXPECT_EQ(first.count(tid), 1u) << "epoch " << e << " ran on thread " << tid
                                      << ", which epoch 0's workers did not include";
    }
  }
}

// Counts how many samples have been read, to see how far ahead the loader works.
class CountingSource : public Source {
 public:
  int64_t size() const override { return 1000; }
  ImageSpec spec() const override { return ImageSpec{2, 2, 1, ColorOrder::kGray, ValueRange::kByte}; }
  const uint8_t* pixels(int64_t) const override {
    ++reads;
    return px_;
  }
  int64_t label(int64_t) const override { return 0; }
  int64_t num_classes() const override { return 1; }
  std::string describe() const override { return "counting"; }
  mutable std::atomic<int64_t> reads{0};

 private:
  uint8_t px_[4] = {};
};

TEST(Loader, PrefetchBoundsWorkAheadD10) {
  auto src = std::make_shared<CountingSource>();
  LoaderOptions o = opts(4);
  o.batch_size = 10;
  o.prefetch = 3;
  Loader l(std::make_shared<ArrayPipeline>(src, test::flip(0.0f), 0), DistributedSampler(1000, false, 0), o);
  // Waits until `n` samples were read (or 10 s), then a little longer to see that no more are.
  auto settles_at = [&](int64_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (src->reads.load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return src->reads.load();
  };
  l.start_epoch(0);
  EXPECT_EQ(settles_at(30), 30);  // exactly `prefetch` batches ahead, no more
  l.next();
  EXPECT_EQ(settles_at(40), 40);
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

// Samples 7 and 40 are unreadable: a bad-input Error naming them.
class BrokenPipeline : public SamplePipeline {
 public:
  int64_t size() const override { return 64; }
  ImageSpec output_spec() const override { return ImageSpec{1, 1, 1, ColorOrder::kGray, ValueRange::kByte}; }
  int64_t produce(int64_t index, int64_t, uint8_t* dst) const override {
    if (index == 7 || index == 40) throw bad_input("img{}.jpg: corrupt JPEG data", index);
    *dst = static_cast<uint8_t>(index);
    return index;
  }
  std::string describe() const override { return "broken"; }
};

TEST(Loader, SkipPolicyLeavesBadSamplesOutAndNamesThemD5) {
  LoaderOptions o = opts(3);
  o.batch_size = 16;
  o.bad_samples = BadSamplePolicy::kSkip;
  Loader l(std::make_shared<BrokenPipeline>(), DistributedSampler(64, false, 0), o);
  auto batches = epoch(l, 0);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[0].size(), 15);
  EXPECT_EQ(batches[2].size(), 15);
  EXPECT_EQ(batches[0].pixels.size(), 15u);
  EXPECT_EQ(batches[0].pixels.data()[7], 8);  // compacted: sample 8 moved into slot 7
  EXPECT_EQ(batches[0].labels[7], 8);
  EXPECT_EQ(l.skipped_count(), 2);
  ASSERT_EQ(l.skipped_names().size(), 2u);
  EXPECT_NE(l.skipped_names()[0].find("img7.jpg"), std::string::npos);
  EXPECT_NE(l.skipped_names()[1].find("img40.jpg"), std::string::npos);
}

TEST(Loader, FailPolicyStopsNamingTheSampleD5) {
  LoaderOptions o = opts(2);
  o.batch_size = 16;
  Loader l(std::make_shared<BrokenPipeline>(), DistributedSampler(64, false, 0), o);
  l.start_epoch(0);
  try {
    while (l.next()) {
    }
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("img7.jpg"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.bad_samples"), std::string::npos) << e.what();
  }
}

// The count measure_loader_threads must pick from its own measurements: the smallest t whose
// rate is at least 90% of the best.
int smallest_within_ten_percent(const std::vector<double>& rates) {
  const double best = *std::max_element(rates.begin(), rates.end());
  for (size_t t = 1; t <= rates.size(); ++t) {
    if (rates[t - 1] >= 0.9 * best) return static_cast<int>(t);
  }
  return -1;
}

// describe() names the choice and every measured rate, as printed.
void expect_describes(const LoaderThreadChoice& c) {
  const std::string d = c.describe();
  EXPECT_EQ(d.rfind(fmt::format("{} thread(s) (measured samples/s with ", c.threads), 0), 0u) << d;
  for (size_t t = 1; t <= c.samples_per_s.size(); ++t) {
    test::expect_contains(d, fmt::format("{}: {:.0f}/s", t, c.samples_per_s[t - 1]));
  }
}

TEST(Loader, ThreadChoiceRuleIsTheSmallestCountWithinTenPercentOfTheBestD10) {
  EXPECT_EQ(LoaderThreadChoice::from_rates({100, 200, 300, 400}).threads, 4);
  EXPECT_EQ(LoaderThreadChoice::from_rates({100, 200, 210, 220}).threads, 2);  // 200 ≥ 0.9 × 220; the best is 4
  EXPECT_EQ(LoaderThreadChoice::from_rates({100, 197, 210, 220}).threads, 3);  // 197 < 198
  EXPECT_EQ(LoaderThreadChoice::from_rates({90, 100, 80}).threads, 1);         // exactly 90%
  EXPECT_EQ(LoaderThreadChoice::from_rates({50, 300, 100, 280}).threads, 2);   // a dip after the best
  EXPECT_EQ(LoaderThreadChoice::from_rates({7}).threads, 1);
  const LoaderThreadChoice c = LoaderThreadChoice::from_rates({1000.4, 1999.6, 2100.0});
  EXPECT_EQ(c.describe(), "2 thread(s) (measured samples/s with 1: 1000/s, 2: 2000/s, 3: 2100/s)");
  EXPECT_EQ(LoaderThreadChoice{}.describe(), "1 thread(s) (not measured)");
}

TEST(Loader, ChoosesTheSmallestThreadCountWithinTenPercentOfTheBestD10) {
  auto src = make_source(2000);
  const LoaderThreadChoice c = measure_loader_threads(ArrayPipeline(src, test::flip(0.5f), 1), 4);
  ASSERT_EQ(c.samples_per_s.size(), 4u);
  for (double r : c.samples_per_s) EXPECT_GT(r, 0.0);
  EXPECT_EQ(c.threads, smallest_within_ten_percent(c.samples_per_s)) << c.describe();
  expect_describes(c);
}

// produce() sleeps 2 ms, like a read waiting on storage; with `serialised`, inside one mutex
// every thread shares, so a second thread only waits for the first.
class SleepingPipeline : public SamplePipeline {
 public:
  explicit SleepingPipeline(bool serialised) : serialised_(serialised) {}
  int64_t size() const override { return 1000; }
  ImageSpec output_spec() const override { return ImageSpec{1, 1, 1, ColorOrder::kGray, ValueRange::kByte}; }
  int64_t produce(int64_t index, int64_t, uint8_t* dst) const override {
    if (serialised_) {
      std::lock_guard<std::mutex> lock(mu_);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    *dst = static_cast<uint8_t>(index);
    return 0;
  }
  std::string describe() const override { return serialised_ ? "serialised sleeper" : "sleeper"; }

 private:
  bool serialised_;
  mutable std::mutex mu_;
};

// I/O-bound work: 4 threads read ~4× the samples of 1 (3 threads ~75% of 4) even on 2 cores.
TEST(Loader, IoBoundPipelineGetsEveryThreadD10) {
  const LoaderThreadChoice c = measure_loader_threads(SleepingPipeline(false), 4);
  ASSERT_EQ(c.samples_per_s.size(), 4u);
  EXPECT_EQ(c.threads, 4) << c.describe();
  EXPECT_GT(c.samples_per_s[3], 2 * c.samples_per_s[0]) << c.describe();
  expect_describes(c);
}

// Serialised work: extra threads add nothing, so one is chosen; the wrapper reports the same.
TEST(Loader, SerialisedPipelineGetsOneThreadD10) {
  const LoaderThreadChoice c = measure_loader_threads(SleepingPipeline(true), 4);
  ASSERT_EQ(c.samples_per_s.size(), 4u);
  EXPECT_EQ(c.threads, 1) << c.describe();
  expect_describes(c);
  std::string report = "untouched";
  EXPECT_EQ(choose_loader_threads(SleepingPipeline(true), 3, &report), 1) << report;
  EXPECT_EQ(report.rfind("1 thread(s) (measured samples/s with 1: ", 0), 0u) << report;
  test::expect_contains(report, ", 3: ");
  report = "untouched";
  EXPECT_EQ(choose_loader_threads(SleepingPipeline(false), 1, &report), 1);  // nothing to measure
  EXPECT_EQ(report, "untouched");
  EXPECT_TRUE(measure_loader_threads(SleepingPipeline(false), 1).samples_per_s.empty());
}

}  // namespace
}  // namespace crucible::data

namespace crucible::data {
namespace {

TEST(Loader, ChannelsFirstCollationIsTheTransposeOfNhwc) {
  ImageSpec spec{2, 3, 3, ColorOrder::kRGB, ValueRange::kByte};
  std::vector<uint8_t> px(10 * 18);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  auto src = std::make_shared<InMemorySource>(spec, px, std::vector<int64_t>(10, 1), "rgb");
  LoaderOptions o = opts(2);
  o.batch_size = 4;
  Loader nhwc(std::make_shared<ArrayPipeline>(src, test::flip(0.0f), 0), DistributedSampler(10, false, 0), o);
  o.channels_first = true;
  Loader nchw(std::make_shared<ArrayPipeline>(src, test::flip(0.0f), 0), DistributedSampler(10, false, 0), o);
  auto a = epoch(nhwc, 0), b = epoch(nchw, 0);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(b[0].channels_first);
  for (size_t i = 0; i < a.size(); ++i) {
    for (int64_t k = 0; k < a[i].size(); ++k) {
      for (int p = 0; p < 6; ++p) {
        for (int c = 0; c < 3; ++c) {
          EXPECT_EQ(a[i].pixels.data()[k * 18 + p * 3 + c], b[i].pixels.data()[k * 18 + c * 6 + p]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace crucible::data
