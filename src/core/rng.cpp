// Philox streams (Random123's philox.h; no other Debian package has a counter-based RNG).
#include "crucible/core/rng.h"

#include <Random123/philox.h>

namespace crucible {
namespace {

using Philox = r123::Philox4x32;

Philox::ctr_type philox(const uint32_t counter[4], const uint32_t key[2]) {
  Philox::ctr_type c = {{counter[0], counter[1], counter[2], counter[3]}};
  Philox::key_type k = {{key[0], key[1]}};
  return Philox()(c, k);
}

}  // namespace

const char* rng_stream_name(RngStream stream) {
  switch (stream) {
    case RngStream::kInit:
      return "init";
    case RngStream::kSampler:
      return "sampler";
    case RngStream::kAugment:
      return "augment";
    case RngStream::kDropout:
      return "dropout";
    case RngStream::kScale:
      return "scale";
    case RngStream::kMix:
      return "mix";
    case RngStream::kErase:
      return "erase";
  }
  return "?";
}

uint64_t derive_seed(uint64_t run_seed, RngStream stream) {
  const uint32_t key[2] = {static_cast<uint32_t>(run_seed), static_cast<uint32_t>(run_seed >> 32)};
  const uint32_t counter[4] = {static_cast<uint32_t>(stream), 0x63727563u /* "cruc" */, 0, 0};
  auto r = philox(counter, key);
  return ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) & 0x7fffffffffffffffULL;
}

SampleRng::SampleRng(uint64_t stream_seed, uint64_t epoch, uint64_t index)
    : key_{static_cast<uint32_t>(stream_seed), static_cast<uint32_t>(stream_seed >> 32)},
      counter_{0, static_cast<uint32_t>(epoch), static_cast<uint32_t>(index),
               static_cast<uint32_t>(index >> 32) ^ static_cast<uint32_t>(epoch >> 32)},
      block_{0, 0, 0, 0} {}

uint32_t SampleRng::next_u32() {
  if (used_ == 4) {
    auto r = philox(counter_, key_);
    for (int i = 0; i < 4; ++i) block_[i] = r.v[i];
    ++counter_[0];
    used_ = 0;
  }
  return block_[used_++];
}

float SampleRng::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

}  // namespace crucible
