// The c10d layer with every rank a thread of this process (Gloo over loopback): collectives,
// the gradient reducer against single-process gradients of the whole batch, M5 (accumulation
// communicates only on the last micro-batch), SyncBatchNorm against BatchNorm over the global
// batch (M3), BatchNorm buffer policies (M2), and a dead rank named by the survivors.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "crucible/core/compat.h"
#include "crucible/core/error.h"
#include "crucible/core/file.h"
#include "test_util.h"
#include "crucible/distributed/comm.h"
#include "crucible/distributed/grad_sync.h"
#include "crucible/distributed/launch.h"
#include "crucible/nn/batch_norm.h"
#include "crucible/nn/model.h"

namespace crucible::distributed {
namespace {

CommOptions test_options() {
  CommOptions o;
  o.timeout_s = 60;
  o.heartbeat_s = 0.5;
  return o;
}

// Runs body(rank, comm) on `size` threads joined in one process group; rethrows the first error.
void with_ranks(int size, const std::function<void(int, Comm&)>& body) {
  const int port = free_port();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        World w;
        w.rank = r;
        w.size = size;
        w.local_rank = r;
        w.local_size = size;
        w.master_port = port;
        auto comm = Comm::connect(w, c10::Device(c10::kCPU), test_options());
        body(r, *comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(Comm, CollectivesAcrossThreeRanks) {
  with_ranks(3, [](int r, Comm& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 3);
    at::Tensor t = at::full({4}, static_cast<double>(r + 1), at::kDouble);
    c.all_reduce_sum(t);
    EXPECT_TRUE(at::equal(t, at::full({4}, 6.0, at::kDouble)));
    at::Tensor b = at::full({2, 2}, static_cast<float>(r * 10));
    c.broadcast(b, 2);
    EXPECT_TRUE(at::equal(b, at::full({2, 2}, 20.0f)));
    const at::Tensor g = c.all_gather(at::full({2}, static_cast<int64_t>(r), at::kLong));
    EXPECT_EQ(g.sizes(), (at::IntArrayRef{3, 2}));
    for (int k = 0; k < 3; ++k) EXPECT_EQ(g[k][1].item<int64_t>(), k);
    // Rank k contributes k+1 rows: 1 + 2 + 3 rows in rank order.
    const at::Tensor v = c.all_gather_varying(at::full({r + 1, 2}, static_cast<float>(r)));
    ASSERT_EQ(v.size(0), 6);
    EXPECT_EQ(v[0][0].item<float>(), 0.0f);
    EXPECT_EQ(v[2][0].item<float>(), 1.0f);
    EXPECT_EQ(v[5][0].item<float>(), 2.0f);
    EXPECT_EQ(c.broadcast_string("k", r == 0 ? "from rank 0" : "ignored", 0), "from rank 0");
    c.barrier();
  });
}

// A two-layer model whose gradients do not depend on the batch split (no BatchNorm).
struct Mlp : torch::nn::Module {
  Mlp() : a(8, 16), b(16, 3) {
    register_module("a", a);
    register_module("b", b);
  }
  at::Tensor forward(const at::Tensor& x) { return b(a(x).relu()); }
  torch::nn::Linear a, b;
};

// Weights of `src` into `dst` (the threads share torch's one CPU generator, so seeding per
// thread would race).
void copy_weights(torch::nn::Module& dst, torch::nn::Module& src) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < dst.parameters().size(); ++i) dst.parameters()[i].copy_(src.parameters()[i]);
  for (size_t i = 0; i < dst.buffers().size(); ++i) dst.buffers()[i].copy_(src.buffers()[i]);
}

std::vector<at::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

// One process's gradients of the mean loss over 16 samples, the reference of the tests below.
struct WholeBatch {
  explicit WholeBatch(uint64_t data_seed) {
    compat::seed_cpu_generator(data_seed);
    x = at::randn({16, 8});
    y = at::randint(0, 3, {16}, at::kLong);
    at::cross_entropy_loss(model.forward(x), y).backward();
    grads = grads_of(model);
  }
  at::Tensor x, y;
  Mlp model;
  std::vector<at::Tensor> grads;
};

TEST(GradSync, TwoRanksAverageToTheWholeBatchGradient) {
  WholeBatch w(7);
  const at::Tensor &x = w.x, &y = w.y;
  Mlp& whole = w.model;
  const auto& expected = w.grads;

  with_ranks(2, [&](int r, Comm& c) {
    Mlp m;  // each rank's own initialisation, then rank 0's weights everywhere
    if (r == 0) copy_weights(m, whole);
    broadcast_module(c, m);
    for (size_t i = 0; i < m.parameters().size(); ++i) {
      ASSERT_TRUE(at::equal(m.parameters()[i], whole.parameters()[i]));
    }
    GradSync sync(c, m.parameters(), /*bucket_mb=*/0.0005);  // 512 bytes: several buckets
    EXPECT_GT(sync.num_buckets(), 1);
    at::cross_entropy_loss(m.forward(x.narrow(0, 8 * r, 8)), y.narrow(0, 8 * r, 8)).backward();
    sync.finish();
    const auto got = grads_of(m);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT((got[i] - expected[i]).abs().max().item<float>(), 1e-6) << "parameter " << i;
    }
  });
}

TEST(GradSync, AccumulationCommunicatesOnlyOnTheLastMicroBatchM5) {
  WholeBatch w(3);
  const at::Tensor &x = w.x, &y = w.y;
  Mlp& whole = w.model;
  const auto& expected = w.grads;

  with_ranks(2, [&](int r, Comm& c) {
    Mlp m;
    copy_weights(m, whole);
    GradSync sync(c, m.parameters(), 0.0005);
    // Rank r's 8 samples as 4 micro-batches of 2; the loss of each weighted 1/4.
    const int64_t before = c.collectives();
    for (int k = 0; k < 4; ++k) {
      sync.communicate(k == 3);
      const int64_t at = 8 * r + 2 * k;
      (at::cross_entropy_loss(m.forward(x.narrow(0, at, 2)), y.narrow(0, at, 2)) * 0.25).backward();
      if (k < 3) {
        EXPECT_EQ(c.collectives(), before) << "micro-batch " << k << " communicated";
      }
    }
    sync.finish();
    EXPECT_EQ(c.collectives() - before, sync.num_buckets());  // each bucket once, on the last one
    const auto got = grads_of(m);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT((got[i] - expected[i]).abs().max().item<float>(), 1e-6) << "parameter " << i;
    }
  });
}

// fmnist_cnn (4 BatchNorms) on 2 ranks × 8 samples with SyncBatchNorm equals one process on
// the 16: logits, every gradient, and the running statistics.
TEST(SyncBatchNorm, TwoRanksEqualOneProcessOnTheGlobalBatchM3) {
  nn::ModelOptions mo;
  mo.dropout = 0;
  compat::seed_cpu_generator(11);
  const at::Tensor x = at::randn({16, 1, 28, 28});
  const at::Tensor y = at::randint(0, 10, {16}, at::kLong);
  compat::seed_cpu_generator(5);
  auto init = nn::make_model(mo, 1, 28, 28, 10);  // the starting weights and buffers of all
  auto whole = nn::make_model(mo, 1, 28, 28, 10);
  copy_weights((*whole->nn_module()), (*init->nn_module()));
  (*whole->nn_module()).train();
  const at::Tensor logits = whole->forward(x);
  at::cross_entropy_loss(logits, y).backward();
  const auto expected = grads_of((*whole->nn_module()));
  std::vector<at::Tensor> expected_buffers;
  for (const auto& b : (*whole->nn_module()).buffers()) expected_buffers.push_back(b.clone());

  with_ranks(2, [&](int r, Comm& c) {
    auto m = nn::make_model(mo, 1, 28, 28, 10);
    copy_weights((*m->nn_module()), (*init->nn_module()));
    (*m->nn_module()).train();
    EXPECT_EQ(nn::convert_sync_batchnorm((*m->nn_module()), &c), 4);
    GradSync sync(c, (*m->nn_module()).parameters(), 25);
    const at::Tensor part = m->forward(x.narrow(0, 8 * r, 8));
    EXPECT_LT((part - logits.narrow(0, 8 * r, 8)).abs().max().item<float>(), 1e-5);
    at::cross_entropy_loss(part, y.narrow(0, 8 * r, 8)).backward();
    sync.finish();
    const auto got = grads_of((*m->nn_module()));
    for (size_t i = 0; i < got.size(); ++i) {
      const float scale = std::max(1.0f, expected[i].abs().max().item<float>());
      EXPECT_LT((got[i] - expected[i]).abs().max().item<float>() / scale, 1e-5) << "parameter " << i;
    }
    const auto buffers = (*m->nn_module()).buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_LT((buffers[i].to(at::kDouble) - expected_buffers[i].to(at::kDouble)).abs().max().item<double>(), 1e-5)
          << "buffer " << i;
    }
  });
}

TEST(SyncBuffers, BroadcastTakesRankZerosAverageTakesTheMeanM2) {
  with_ranks(2, [](int r, Comm& c) {
    for (const std::string policy : {"broadcast", "average"}) {
      nn::BatchNorm2d bn(3);
      bn->running_mean.fill_(static_cast<double>(r + 1));  // 1 on rank 0, 2 on rank 1
      bn->running_var.fill_(static_cast<double>(4 * (r + 1)));
      sync_buffers(c, *bn, policy);
      const float want_mean = policy == "broadcast" ? 1.0f : 1.5f;
      const float want_var = policy == "broadcast" ? 4.0f : 6.0f;
      EXPECT_TRUE(at::allclose(bn->running_mean, at::full({3}, want_mean))) << policy;
      EXPECT_TRUE(at::allclose(bn->running_var, at::full({3}, want_var))) << policy;
    }
  });
}

TEST(Comm, RankZeroWritesOnceTheOthersReadAfterX3) {
  test::TempDir d;
  const std::string path = d.path() + "/shared.txt";
  with_ranks(3, [&](int r, Comm& c) {
    rank0_then_all(&c, "write shared.txt", [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others must wait
      write_file_atomic(path, "made by rank 0");
    });
    EXPECT_EQ(test::read_text(path), "made by rank 0") << "rank " << r;
    // A failure on rank 0 reaches every rank.
    try {
      rank0_then_all(&c, "make the second file", [] { throw bad_input("disk full"); });
      ADD_FAILURE() << "rank " << r << " went on";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(r == 0 ? "disk full" : "rank 0 failed to make the second file"),
                std::string::npos)
          << e.what();
    }
  });
}

// A rank that leaves (its process group and heartbeats gone, as when it is killed) makes the
// survivor's next collective fail with a message naming it.
TEST(Comm, ACollectiveWithADeadRankNamesIt) {
  std::string message;
  with_ranks(3, [&](int r, Comm& c) {
    c.barrier();
    if (r == 1) return;  // rank 1 "dies": its Comm is destroyed
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    at::Tensor t = at::ones({8});
    try {
      c.all_reduce_sum(t);
      ADD_FAILURE() << "rank " << r << ": all-reduce without rank 1 succeeded";
    } catch (const Error& e) {
      if (r == 0) message = e.what();
    }
  });
  EXPECT_NE(message.find("rank 1 stopped answering"), std::string::npos) << message;
  EXPECT_EQ(message.find("rank 2 stopped"), std::string::npos) << message;
}

}  // namespace
}  // namespace crucible::distributed
