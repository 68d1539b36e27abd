// `crucible-torch`: the subcommands that need libtorch (train, eval, predict, tune). The `crucible`
// program (front.cpp) runs them by exec'ing this binary with the same arguments, so that the
// other subcommands start without loading libtorch (~1 s and ~160 MB before main). Parses the
// command line, calls the library, and turns errors into exit codes (0 ok, 1 runtime failure,
// 2 bad input/usage, 3 diverged).
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/obs/progress.h"
#include "crucible/train/doctor.h"
#include "crucible/train/model_bench.h"
#include "crucible/train/job_config.h"
#include "crucible/train/predict.h"
#include "crucible/train/trainer.h"
#include <nlohmann/json.hpp>
#include "crucible/train/tune.h"

namespace crucible {
extern const char* const kDefaultConfigToml;  // configs/fashion_mnist.toml, embedded at build time
}

namespace {

using namespace crucible;

void on_signal(int sig) {
  train::request_stop();
  std::signal(sig, SIG_DFL);  // a second Ctrl-C ends the process at once
}

int rank_from_env() {
  const char* r = std::getenv("RANK");
  return r != nullptr ? std::atoi(r) : 0;
}

// The job of `config_path` (or the built-in default) with --set overrides applied.
train::JobConfig load_job(const std::string& config_path, const std::vector<std::string>& overrides) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema, train::registered_names());
  if (config_path.empty()) {
    schema.load_string(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)");
  } else {
    schema.load_file(config_path);
  }
  for (const auto& o : overrides) schema.apply_override(o);
  return job;
}

int run_tune_batch(const std::string& config_path, const std::vector<std::string>& overrides, double budget_mb,
                   int64_t max_batch, bool json) {
  const train::JobConfig job = load_job(config_path, overrides);
  const train::TuneResult r = train::tune_batch(job, static_cast<int64_t>(budget_mb * 1048576.0), max_batch);
  log_info("largest batch that fits{}: {} (T17; {} tries)",
           budget_mb > 0 ? fmt::format(" in {} MiB", budget_mb) : std::string(" on the device"), r.batch,
           r.tries.size());
  if (json) {
    std::printf("{\"batch\": %lld, \"peak_bytes\": %lld, \"tries\": %zu}\n", static_cast<long long>(r.batch),
                static_cast<long long>(r.peak_bytes), r.tries.size());
  }
  return 0;
}

int run_train(const std::string& config_path, const std::vector<std::string>& overrides, bool resume, bool restart) {
  train::JobConfig job = load_job(config_path, overrides);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  train::Trainer trainer(
      job, train::TrainFlags{resume, restart,
                             train::resolve_job_toml(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)")});
  train::TrainSummary s = trainer.run();
  log_info("{}: test accuracy {:.2f}%  train {}  wall {}  {:.0f} samples/s  params sha256 {}…  → {}/summary.json",
           s.already_complete ? "complete" : "done", 100 * s.test_acc, obs::Progress::format_duration(s.train_seconds),
           obs::Progress::format_duration(s.wall_seconds), s.samples_per_s, s.params_sha256.substr(0, 12), s.run_dir);
  return 0;
}

int run_eval(const std::string& config_path, const std::vector<std::string>& overrides, const std::string& checkpoint,
             bool json) {
  const train::JobConfig job = load_job(config_path, overrides);
  train::Trainer trainer(job);
  const train::TrainSummary s = trainer.evaluate_checkpoint(checkpoint);
  log_info("eval: test accuracy {:.2f}% (top-5 {:.2f}%), loss {:.6f}, model of step {} from {}", 100 * s.test_acc,
           100 * s.test_top5, s.test_loss, s.steps, s.run_dir);
  if (json && log_rank() == 0) {
    const nlohmann::json j = {{"test_acc", s.test_acc}, {"test_top5", s.test_top5}, {"test_loss", s.test_loss},
                              {"step", s.steps},
                              {"checkpoint", s.run_dir}, {"params_sha256", s.params_sha256}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// Processes that will share this machine: crucible launch / torchrun's LOCAL_WORLD_SIZE, or
// --nproc given to doctor.
int run_doctor(const std::string& config_path, const std::vector<std::string>& overrides, int nproc, bool json) {
  const train::JobConfig job = load_job(config_path, overrides);
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  const int local = nproc > 0 ? nproc : (lws != nullptr ? std::max(1, std::atoi(lws)) : 1);
  const train::DoctorReport r = train::run_doctor(job, local);
  if (json) {
    std::printf("%s\n", r.to_json().c_str());
  } else {
    std::printf("%s%s\n", r.to_text().c_str(),
                r.failed() ? "doctor: a check failed: the run would fail or waste its time (fix above)"
                           : "doctor: nothing would stop this run");
  }
  return r.failed() ? 1 : 0;
}

int run_predict(const std::string& config_path, const std::vector<std::string>& overrides,
                const train::PredictOptions& options) {
  const train::JobConfig job = load_job(config_path, overrides);
  train::Trainer trainer(job);
  const train::PredictSummary s = trainer.predict(options);
  log_info("predict: {} samples, top-1 {:.2f}%, top-{} {:.2f}% ({}) → {}", s.samples, 100 * s.top1_acc, s.k,
           100 * s.topk_acc, s.model, s.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tune_host_allocator();  // first, before the allocations it should govern
  set_log_rank(rank_from_env());

  CLI::App app{"crucible: a training engine on libtorch that makes the classic training pitfalls loud", "crucible"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("crucible ") + CRUCIBLE_VERSION);

  std::string config_path;
  std::vector<std::string> overrides;
  bool resume = false, restart = false;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model (default: Fashion-MNIST, configs/fashion_mnist.toml)");
  train_cmd->add_option("config", config_path, "TOML config file (default: the built-in Fashion-MNIST job)")
      ->check(CLI::ExistingFile);
  train_cmd->add_option("--set", overrides, "override one key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  auto* resume_flag = train_cmd->add_flag("--resume", resume, "continue the run in <run.dir>/<run.name> (error if none)");
  train_cmd->add_flag("--restart", restart, "discard that run's checkpoints and metrics and start afresh")
      ->excludes(resume_flag);
  {
    // The built-in job must load; if it does not, this build is broken (say so, do not guess).
    train::JobConfig defaults;
    ConfigSchema schema;
    train::bind_job_config(defaults, schema, train::registered_names());
    try {
      schema.load_string(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)");
    } catch (const Error& e) {
      log_error("internal error: the built-in config does not load: {}", e.what());
      return 1;
    }
    train_cmd->footer("\nConfig keys (value of the default job; override with --set section.key=value):\n" +
                      schema.help_text());
  }

  std::string eval_config, eval_checkpoint;
  std::vector<std::string> eval_overrides;
  bool eval_json = false;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "evaluate a checkpoint on the test set (under crucible launch: sharded, gathered, exact)");
  eval_cmd->add_option("config", eval_config, "TOML config file (default: the built-in job)")->check(CLI::ExistingFile);
  eval_cmd->add_option("--set", eval_overrides, "override one key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  eval_cmd->add_option("--checkpoint", eval_checkpoint,
                       "checkpoint file (default: the newest that verifies in <run.dir>/<run.name>/checkpoints)");
  eval_cmd->add_flag("--json", eval_json, "print one JSON object as the last line (rank 0)");

  std::string predict_config;
  std::vector<std::string> predict_overrides;
  train::PredictOptions predict_options;
  CLI::App* predict_cmd = app.add_subcommand(
      "predict", "write each test sample's top-K classes and probabilities to a .jsonl or .csv file");
  predict_cmd->add_option("config", predict_config, "TOML config file (default: the built-in job)")
      ->check(CLI::ExistingFile);
  predict_cmd->add_option("--set", predict_overrides, "override one key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  predict_cmd->add_option("--checkpoint", predict_options.checkpoint,
                          "checkpoint file (default: the newest that verifies in <run.dir>/<run.name>/checkpoints; "
                          "with none there, the config's model.init or TorchScript model.path)");
  predict_cmd->add_option("--top", predict_options.top_k,
                          "K: classes per sample, best first (clamped to the class count)")
      ->capture_default_str();
  predict_cmd->add_option("--out", predict_options.out, "file to write, atomically (rank 0)")
      ->type_name("FILE")
      ->required();
  predict_cmd->footer(
      "\nOne record per test sample (data.test_*), in sample order; probabilities are softmax of the logits.\n"
      "  FILE.jsonl: {\"index\":i,\"label\":y,\"top\":[class ids, best first],\"prob\":[their probabilities]}\n"
      "  FILE.csv:   header index,label,top1,...,topK,prob1,...,probK; one row per sample\n"
      "Under crucible launch the test set is sharded and rank 0 writes the same file one process would.\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 bad usage (K < 1, another extension, no checkpoint).");

  std::string doctor_config;
  std::vector<std::string> doctor_overrides;
  int doctor_nproc = 0;
  bool doctor_json = false;
  CLI::App* doctor_cmd = app.add_subcommand(
      "doctor", "check the machine and the job before a long run (threads, memory, ulimit -n, bf16, CUDA, data)");
  doctor_cmd->add_option("config", doctor_config, "TOML config file (default: the built-in job)")
      ->check(CLI::ExistingFile);
  doctor_cmd->add_option("--set", doctor_overrides, "override one key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  doctor_cmd->add_option("--nproc", doctor_nproc, "processes that will train on this machine (crucible launch --nproc)")
      ->check(CLI::PositiveNumber);
  doctor_cmd->add_flag("--json", doctor_json, "print the checks as one JSON object");
  doctor_cmd->footer("\nExit codes: 0 nothing would stop the run (warnings may be printed), 1 a check failed, 2 bad usage.");

  CLI::App* tune_cmd = app.add_subcommand("tune", "find settings by measuring them");
  tune_cmd->require_subcommand(1);
  std::string tune_config;
  std::vector<std::string> tune_overrides;
  double tune_budget_mb = 0;
  int64_t tune_max = 65536;
  bool tune_json = false;
  CLI::App* tune_batch_cmd = tune_cmd->add_subcommand(
      "batch", "the largest batch whose training step fits a memory budget (T17), by doubling then bisecting");
  tune_batch_cmd->add_option("config", tune_config, "TOML config (default: the built-in job)")->check(CLI::ExistingFile);
  tune_batch_cmd->add_option("--set", tune_overrides, "override a config key")->type_name("KEY=VALUE");
  tune_batch_cmd->add_option("--budget-mb", tune_budget_mb,
                             "memory budget for one step (parameters, gradients, optimizer state, activations); "
                             "required on CPU")
      ->check(CLI::PositiveNumber);
  tune_batch_cmd->add_option("--max", tune_max, "largest batch to try")->check(CLI::PositiveNumber);
  tune_batch_cmd->add_flag("--json", tune_json, "print one JSON object as the last line");

  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks of crucible's parts, timed alone (X9)");
  bench_cmd->require_subcommand(1);
  std::string bench_config;
  std::vector<std::string> bench_overrides;
  train::ModelBenchOptions bench_options;
  bool bench_json = false, bench_job_precision = false;
  CLI::App* bench_model_cmd = bench_cmd->add_subcommand(
      "model", "time the job's model at a batch size: forward, and the whole training step, in every precision and "
               "memory format precision = \"auto\" considers; median and p90 after warm-up, memory peak (X9)");
  bench_model_cmd->add_option("config", bench_config, "TOML config (default: the built-in job)")
      ->check(CLI::ExistingFile);
  bench_model_cmd->add_option("--set", bench_overrides, "override a config key")->type_name("KEY=VALUE");
  bench_model_cmd->add_option("--batch", bench_options.batch, "batch size (default: train.batch_size)")
      ->check(CLI::PositiveNumber);
  bench_model_cmd->add_option("--warmup", bench_options.warmup, "runs before counting (default 3)")
      ->check(CLI::NonNegativeNumber);
  bench_model_cmd->add_option("--repeats", bench_options.repeats, "counted runs at most (default 20, at least 3)");
  bench_model_cmd->add_option("--seconds", bench_options.seconds,
                              "… or as many as fit in this many seconds per measurement (default 10; at least 3 runs)")
      ->check(CLI::PositiveNumber);
  bench_model_cmd->add_flag("--job-precision", bench_job_precision,
                            "only the job's precision (auto: what it picks here) instead of every candidate");
  bench_model_cmd->add_flag("--json", bench_json, "print one JSON object as the last line");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  try {
    if (train_cmd->parsed()) return run_train(config_path, overrides, resume, restart);
    if (eval_cmd->parsed()) return run_eval(eval_config, eval_overrides, eval_checkpoint, eval_json);
    if (predict_cmd->parsed()) return run_predict(predict_config, predict_overrides, predict_options);
    if (doctor_cmd->parsed()) return run_doctor(doctor_config, doctor_overrides, doctor_nproc, doctor_json);
    if (bench_model_cmd->parsed()) {
      bench_options.all_precisions = !bench_job_precision;
      const train::ModelBenchResult r = train::bench_model(load_job(bench_config, bench_overrides), bench_options);
      std::printf("%s", r.to_text().c_str());
      if (bench_json) std::printf("%s\n", r.to_json().c_str());
      return 0;
    }
    if (tune_batch_cmd->parsed()) {
      if (tune_budget_mb <= 0) throw bad_input("tune batch: give --budget-mb (on CPU the budget cannot be read from a device)");
      return run_tune_batch(tune_config, tune_overrides, tune_budget_mb, tune_max, tune_json);
    }
  } catch (const Error& e) {
    log_error("{}", e.what());
    return exit_code(e.kind());
  } catch (const c10::Error& e) {
    log_error("libtorch: {}", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    return 1;
  }
  return 0;
}
