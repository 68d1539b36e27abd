// Law 1 / D5 / D8 / D10: batches are identical for 1 and 4 threads, flips come from the
// sample's own stream, a resumed position continues the same epoch, worker errors reach the
// consumer, and bad samples are skipped (named, counted) or fail the run naming the sample.
#include "crucible/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "crucible/core/error.h"

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
  return std::make_shared<ArrayPipeline>(std::move(src), 0.5f, 99);
}

// Law 1: thread timing never changes what a batch holds.
TEST(Loader, SameBatchesForOneAndFourThreads) {
  auto src = make_source(1000);
  Loader one(flipping(src), Sampler(1000, true, 5), opts(1));
  Loader four(flipping(src), Sampler(1000, true, 5), opts(4));
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
  Loader l(flipping(src), Sampler(400, false, 0), opts(2));
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
  Loader l(flipping(src), Sampler(500, true, 3), opts(3));
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
  Loader l(flipping(src), Sampler(2000, true, 3), opts(4));
  l.start_epoch(0);
  l.next();  // leave prefetched batches of epoch 0 in flight
  auto e1 = epoch(l, 1);
  Loader fresh(flipping(src), Sampler(2000, true, 3), opts(1));
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
  Loader l(flipping(std::make_shared<FailingSource>()), Sampler(100, false, 0), opts(2));
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
      const std::vector<int64_t> full = Sampler(n, true, 7).epoch_order(2);
      std::vector<int64_t> seen;
      for (int64_t rank = 0; rank < world; ++rank) {
        Loader l(flipping(src), Sampler(n, true, 7, Sampler::Shard{world, rank, drop}), opts(2));
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

int process_threads() {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

TEST(Loader, OnePersistentPoolAcrossEpochsD8) {
  auto src = make_source(300);
  Loader l(flipping(src), Sampler(300, true, 1), opts(3));
  epoch(l, 0);
  const int threads = process_threads();
  for (int e = 1; e < 6; ++e) epoch(l, e);
  EXPECT_EQ(process_threads(), threads);  // no workers created or leaked per epoch
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
  Loader l(std::make_shared<ArrayPipeline>(src, 0.0f, 0), Sampler(1000, false, 0), o);
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
  Loader l(std::make_shared<BrokenPipeline>(), Sampler(64, false, 0), o);
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
  Loader l(std::make_shared<BrokenPipeline>(), Sampler(64, false, 0), o);
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

TEST(Loader, ChoosesAThreadCountD10) {
  auto src = make_source(2000);
  std::string report;
  const int t = choose_loader_threads(ArrayPipeline(src, 0.5f, 1), 2, &report);
  EXPECT_GE(t, 1);
  EXPECT_LE(t, 2);
  EXPECT_NE(report.find("measured"), std::string::npos) << report;
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
  Loader nhwc(std::make_shared<ArrayPipeline>(src, 0.0f, 0), Sampler(10, false, 0), o);
  o.channels_first = true;
  Loader nchw(std::make_shared<ArrayPipeline>(src, 0.0f, 0), Sampler(10, false, 0), o);
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
