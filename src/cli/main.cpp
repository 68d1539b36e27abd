// `crucible-torch`: the subcommands that need libtorch (train, eval, predict, tune). The `crucible`
// program (front.cpp) runs them by exec'ing this binary with the same arguments, so that the
// other subcommands start without loading libtorch (~1 s and ~160 MB before main). Parses the
// command line, calls the library, and turns errors into exit codes (0 ok, 1 runtime failure,
// 2 bad input/usage, 3 diverged).
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include "crucible/data/eval/coco_eval.h"
#include "crucible/commands/doctor.h"
#include "crucible/commands/evaluate.h"
#include "crucible/commands/model_bench.h"
#include "crucible/commands/predict.h"
#include "crucible/commands/preview.h"
#include "crucible/commands/tune.h"
#include "crucible/core/config.h"
#include "crucible/core/error.h"
#include "crucible/core/log.h"
#include "crucible/core/memory.h"
#include "crucible/distributed/launch_store.h"
#include "crucible/obs/progress.h"
#include "crucible/train/job_config.h"
#include "crucible/train/trainer.h"
#include "crucible/train/weight_set.h"
#include "distributed_commands.h"

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

// The options every job subcommand takes, declared once: the config file, --set overrides and,
// where the command prints one, --json.
struct JobArgs {
  std::string config;
  std::vector<std::string> overrides;
  bool json = false;
};

void add_job_options(CLI::App* cmd, JobArgs& a, const std::string& json_help = "",
                     const std::string& config_help = "TOML config file (default: the built-in job)") {
  cmd->add_option("config", a.config, config_help)->check(CLI::ExistingFile);
  cmd->add_option("--set", a.overrides, "override one key: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  if (!json_help.empty()) cmd->add_flag("--json", a.json, json_help);
}

// The last --set of `key` ("train.batch_size=8"), or "" when none.
std::string set_of(const JobArgs& a, const std::string& key) {
  for (auto it = a.overrides.rbegin(); it != a.overrides.rend(); ++it) {
    if (it->rfind(key + "=", 0) == 0) return *it;
  }
  return "";
}

// The job of `a.config` (or the built-in default) with --set overrides applied.
train::JobConfig load_job(const JobArgs& a) {
  train::JobConfig job;
  ConfigSchema schema;
  train::bind_job_config(job, schema);
  if (a.config.empty()) {
    schema.load_string(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)");
  } else {
    schema.load_file(a.config);
  }
  for (const auto& o : a.overrides) schema.apply_override(o);
  return job;
}

int run_tune_batch(const JobArgs& args, double budget_mb, int64_t max_batch) {
  const commands::TuneResult r =
      commands::tune_batch(load_job(args), static_cast<int64_t>(budget_mb * 1048576.0), max_batch);
  log_info("largest batch that fits{}: {} (T17; {} tries)",
           budget_mb > 0 ? fmt::format(" in {} MiB", budget_mb) : std::string(" on the device"), r.batch,
           r.tries.size());
  if (args.json) {
    std::printf("{\"batch\": %lld, \"peak_bytes\": %lld, \"tries\": %zu}\n", static_cast<long long>(r.batch),
                static_cast<long long>(r.peak_bytes), r.tries.size());
  }
  return 0;
}

int run_train(const JobArgs& args, bool resume, bool restart) {
  train::JobConfig job = load_job(args);

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  train::Trainer trainer(
      job, train::TrainFlags{resume, restart,
                             train::resolve_job_toml(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)")});
  train::TrainSummary s = trainer.run();
  const std::string figure = s.test_coco.empty() ? fmt::format("test accuracy {:.2f}%", 100 * s.test_acc)
                                                 : fmt::format("test AP {:.4f} (AP50 {:.4f})", s.test_coco[0], s.test_coco[1]);
  log_info("{}: {}  train {}  wall {}  {:.0f} samples/s  params sha256 {}…  → {}/summary.json",
           s.already_complete ? "complete" : "done", figure, obs::Progress::format_duration(s.train_seconds),
           obs::Progress::format_duration(s.wall_seconds), s.samples_per_s, s.params_sha256.substr(0, 12), s.run_dir);
  return 0;
}

int run_eval(const JobArgs& args, const std::string& checkpoint, const std::string& weights) {
  const commands::EvalSummary s = commands::evaluate_checkpoint(load_job(args), checkpoint, weights);
  const std::string& what = train::weight_set_registry().get(s.weights, "--weights").factory.what;
  if (s.test_coco.empty()) {
    log_info("eval: test accuracy {:.2f}% (top-5 {:.2f}%), loss {:.6f}, {} of step {} from {}", 100 * s.test_acc,
             100 * s.test_top5, s.test_loss, what, s.step, s.checkpoint);
  } else {  // a detector: COCOeval.summarize()'s 12 lines
    log_info("eval: {} of step {} from {}, COCO bbox:\n{}", what, s.step, s.checkpoint, s.coco_summary);
  }
  if (args.json && log_rank() == 0) {
    nlohmann::json j = {{"step", s.step},
                        {"checkpoint", s.checkpoint},
                        {"params_sha256", s.params_sha256},
                        {"weights", s.weights}};
    if (s.test_coco.empty()) {
      j["test_acc"] = s.test_acc;
      j["test_top5"] = s.test_top5;
      j["test_loss"] = s.test_loss;
    }
    for (size_t k = 0; k < s.test_coco.size(); ++k) j[std::string("test_") + data::coco_stat_names()[k]] = s.test_coco[k];
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// Processes that will share this machine: crucible launch / torchrun's LOCAL_WORLD_SIZE, or
// --nproc given to doctor.
int run_doctor(const JobArgs& args, int nproc) {
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  const int local = nproc > 0 ? nproc : (lws != nullptr ? std::max(1, std::atoi(lws)) : 1);
  const train::DoctorReport r = commands::run_doctor(load_job(args), local);
  if (args.json) {
    std::printf("%s\n", r.to_json().c_str());
  } else {
    std::printf("%s%s\n", r.to_text().c_str(),
                r.failed() ? "doctor: a check failed: the run would fail or waste its time (fix above)"
                           : "doctor: nothing would stop this run");
  }
  return r.failed() ? 1 : 0;
}

int run_predict(const JobArgs& args, const commands::PredictOptions& options) {
  const commands::PredictSummary s = commands::predict(load_job(args), options);
  if (!s.coco.empty()) {
    log_info("predict: {} detections on {} images, COCO AP {:.4f} (AP50 {:.4f}) ({}) → {}", s.detections, s.samples,
             s.coco[0], s.coco[1], s.model, s.out);
    return 0;
  }
  log_info("predict: {} samples, top-1 {:.2f}%, top-{} {:.2f}% ({}) → {}", s.samples, 100 * s.top1_acc, s.k,
           100 * s.topk_acc, s.model, s.out);
  return 0;
}

// A subcommand: its command line (declared by an add_* function below) and what runs when it
// was the one parsed.
struct Subcommand {
  CLI::App* cli;
  std::function<int()> run;
};

// eval's and predict's --weights: the weight sets a checkpoint may hold (weight_set.h).
void add_weights_option(CLI::App* cmd, std::string& weights) {
  std::string help = "which weights of the checkpoint:";
  for (const auto& e : train::weight_set_registry().entries()) help += " " + e.name + " (" + e.help + "),";
  help.back() = '.';
  cmd->add_option("--weights", weights, help)
      ->check(CLI::IsMember(train::weight_set_registry().names()))
      ->capture_default_str();
}

// The built-in job's keys for `train --help`. The built-in job must load; if it does not, this
// build is broken: Error, which main reports as an internal error.
std::string config_keys_help() {
  train::JobConfig defaults;
  ConfigSchema schema;
  train::bind_job_config(defaults, schema);
  schema.load_string(kDefaultConfigToml, "configs/fashion_mnist.toml (built in)");
  return "\nConfig keys (value of the default job; override with --set section.key=value):\n" + schema.help_text();
}

Subcommand add_train(CLI::App& app) {
  struct Args : JobArgs {
    bool resume = false, restart = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model (default: Fashion-MNIST, configs/fashion_mnist.toml)");
  add_job_options(cmd, *a, "", "TOML config file (default: the built-in Fashion-MNIST job)");
  auto* resume_flag = cmd->add_flag("--resume", a->resume, "continue the run in <run.dir>/<run.name> (error if none)");
  cmd->add_flag("--restart", a->restart, "discard that run's checkpoints and metrics and start afresh")
      ->excludes(resume_flag);
  cmd->footer(config_keys_help());
  return {cmd, [a] { return run_train(*a, a->resume, a->restart); }};
}

Subcommand add_eval(CLI::App& app) {
  struct Args : JobArgs {
    std::string checkpoint;
    std::string weights = "model";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "evaluate a checkpoint on the test set (under crucible launch: sharded, gathered, exact)");
  add_job_options(cmd, *a, "print one JSON object as the last line (rank 0)");
  cmd->add_option("--checkpoint", a->checkpoint,
                  "checkpoint file (default: the newest that verifies in <run.dir>/<run.name>/checkpoints)");
  add_weights_option(cmd, a->weights);
  cmd->footer("\nExit codes: 0 ok, 1 runtime failure, 2 bad usage (no checkpoint, --weights ema of a run without "
              "train.ema).");
  return {cmd, [a] { return run_eval(*a, a->checkpoint, a->weights); }};
}

Subcommand add_predict(CLI::App& app) {
  struct Args : JobArgs {
    commands::PredictOptions options;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "predict",
      "write each test sample's top-K classes and probabilities to a .jsonl or .csv file (a detector: its "
      "detections as COCO results .json)");
  add_job_options(cmd, *a);
  cmd->add_option("--checkpoint", a->options.checkpoint,
                  "checkpoint file (default: the newest that verifies in <run.dir>/<run.name>/checkpoints; "
                  "with none there, the config's model.init or TorchScript model.path)");
  add_weights_option(cmd, a->options.weights);
  cmd->add_option("--top", a->options.top_k, "K: classes per sample, best first (clamped to the class count)")
      ->capture_default_str();
  cmd->add_option("--out", a->options.out, "file to write, atomically (rank 0)")->type_name("FILE")->required();
  cmd->footer(
      "\nOne record per test sample (data.test_*), in sample order; probabilities are softmax of the logits.\n"
      "  FILE.jsonl: {\"index\":i,\"label\":y,\"top\":[class ids, best first],\"prob\":[their probabilities]}\n"
      "  FILE.csv:   header index,label,top1,...,topK,prob1,...,probK; one row per sample\n"
      "A detector writes COCO results, which pycocotools' loadRes reads (its numbers are `crucible eval`'s):\n"
      "  FILE.json:  [{\"image_id\":i,\"category_id\":c,\"bbox\":[x,y,w,h],\"score\":s}, ...]\n"
      "Under crucible launch the test set is sharded and rank 0 writes the same file one process would.\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 bad usage (K < 1, another extension, no checkpoint, --weights ema\n"
      "of a run without train.ema).");
  return {cmd, [a] { return run_predict(*a, a->options); }};
}

Subcommand add_preview(CLI::App& app) {
  struct Args : JobArgs {
    commands::PreviewOptions options;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "preview", "write a PNG grid of training samples as the model sees them (augmentations, MixUp/CutMix), labelled");
  add_job_options(cmd, *a, "print one JSON object as the last line");
  cmd->add_option("--n", a->options.n, "samples to show: the first of epoch 0, in training order")
      ->capture_default_str();
  cmd->add_option("--out", a->options.out, "PNG file to write, atomically")->type_name("FILE.png")->required();
  cmd->footer(
      "\nThe samples after the crop, flip, data.augment, random erasing and MixUp/CutMix, before normalisation, as\n"
      "the first steps of `crucible train` with the same config draw them (train.multi_scale is not applied).\n"
      "Under each tile its class, or for a mixed target its two largest classes (\"3+7\"); the exact shares are\n"
      "in the PNG's tEXt chunk \"crucible.labels\" (JSON, one object per tile).\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 bad usage (--n < 1, not .png, float-feature data).");
  return {cmd, [a] {
            const commands::PreviewSummary s = commands::preview(load_job(*a), a->options);
            if (a->json) {
              nlohmann::json not_applied = nlohmann::json::object();
              for (const auto& [key, why] : s.not_applied) not_applied[key] = why;
              const nlohmann::json j = {{"out", a->options.out}, {"samples", s.samples}, {"columns", s.columns},
                                        {"rows", s.rows}, {"width", s.width}, {"height", s.height},
                                        {"batches", s.batches}, {"mixed", s.mixed}, {"not_applied", not_applied}};
              std::printf("%s\n", j.dump().c_str());
            }
            return 0;
          }};
}

Subcommand add_doctor(CLI::App& app) {
  struct Args : JobArgs {
    int nproc = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "check the machine and the job before a long run (threads, memory, ulimit -n, bf16, CUDA, data)");
  add_job_options(cmd, *a, "print the checks as one JSON object");
  cmd->add_option("--nproc", a->nproc, "processes that will train on this machine (crucible launch --nproc)")
      ->check(CLI::PositiveNumber);
  cmd->footer("\nExit codes: 0 nothing would stop the run (warnings may be printed), 1 a check failed, 2 bad usage.");
  return {cmd, [a] { return run_doctor(*a, a->nproc); }};
}

Subcommand add_tune_batch(CLI::App& tune) {
  struct Args : JobArgs {
    double budget_mb = 0;
    int64_t max = 65536;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = tune.add_subcommand(
      "batch", "the largest batch whose training step fits a memory budget (T17), by doubling then bisecting");
  add_job_options(cmd, *a, "print one JSON object as the last line");
  cmd->add_option("--budget-mb", a->budget_mb,
                  "memory budget for one step (parameters, gradients, optimizer state, activations); required on CPU")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max", a->max, "largest batch to try")->check(CLI::PositiveNumber);
  return {cmd, [a] {
            if (a->budget_mb <= 0) {
              throw bad_input("tune batch: give --budget-mb (on CPU the budget cannot be read from a device)");
            }
            return run_tune_batch(*a, a->budget_mb, a->max);
          }};
}

Subcommand add_bench_model(CLI::App& bench) {
  struct Args : JobArgs {
    commands::ModelBenchOptions options;
    bool job_precision = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "model", "time the job's model at a batch size: forward, and the whole training step, in every precision and "
               "memory format precision = \"auto\" considers; median and p90 after warm-up, memory peak (X9)");
  add_job_options(cmd, *a, "print one JSON object as the last line");
  cmd->add_option("--batch", a->options.batch, "batch size (default: train.batch_size)")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->options.warmup, "runs before counting (default 3)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--repeats", a->options.repeats, "counted runs at most (default 20, at least 3)");
  cmd->add_option("--seconds", a->options.seconds,
                  "… or as many as fit in this many seconds per measurement (default 10; at least 3 runs)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--job-precision", a->job_precision,
                "only the job's precision (auto: what it picks here) instead of every candidate");
  return {cmd, [a] {
            a->options.all_precisions = !a->job_precision;
            const train::JobConfig job = load_job(*a);
            // --batch given and a --set of train.batch_size that says otherwise: which was meant?
            if (const std::string set = set_of(*a, "train.batch_size");
                a->options.batch > 0 && !set.empty() && job.train.batch_size != a->options.batch) {
              throw bad_input("bench model: --batch {} and --set {} disagree: give one of them, or the same value",
                              a->options.batch, set);
            }
            const commands::ModelBenchResult r = commands::bench_model(job, a->options);
            std::printf("%s", r.to_text().c_str());
            if (a->json) std::printf("%s\n", r.to_json().c_str());
            return 0;
          }};
}

// Runs `f`, turning errors into exit codes (0 ok, 1 runtime failure, 2 bad input, 3 diverged).
int with_exit_codes(const std::function<int()>& f) {
  try {
    return f();
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
}

}  // namespace

int main(int argc, char** argv) {
  tune_host_allocator();  // first, before the allocations it should govern
  set_log_rank(rank_from_env());

  CLI::App app{"crucible: a training engine on libtorch that makes the classic training pitfalls loud", "crucible"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("crucible ") + CRUCIBLE_VERSION);
  std::vector<Subcommand> subcommands;
  try {
    subcommands = {add_train(app), add_eval(app), add_predict(app), add_doctor(app), add_preview(app)};
    CLI::App* tune = app.add_subcommand("tune", "find settings by measuring them");
    tune->require_subcommand(1);
    subcommands.push_back(add_tune_batch(*tune));
    CLI::App* bench = app.add_subcommand("bench", "benchmarks of crucible's parts, timed alone (X9)");
    bench->require_subcommand(1);
    subcommands.push_back(add_bench_model(*bench));
    // `crucible launch --nnodes N>1` comes here from the front (its launchers need the c10d store).
    static distributed::LaunchOptions launch_options;
    subcommands.push_back({cli::add_launch(app, launch_options),
                           [] { return distributed::launch(launch_options, distributed::open_tcp_launch_store); }});
  } catch (const Error& e) {
    log_error("internal error: the built-in config does not load: {}", e.what());
    return 1;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  for (const auto& c : subcommands) {
    if (c.cli->parsed()) return with_exit_codes(c.run);
  }
  return 0;
}
