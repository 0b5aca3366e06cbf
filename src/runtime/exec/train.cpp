// run_training (launch or join), one rank's process setup, the training loop, checkpoints.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/Device.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "dynapipe/core/error.h"
#include "dynapipe/core/units.h"
#include "dynapipe/runtime/launcher.h"
#include "runtime/exec/c10d_key_value.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/exec/metrics.h"
#include "runtime/exec/plan_ahead.h"
#include "runtime/exec/plan_codec.h"
#include "runtime/exec/trainer.h"
#include "runtime/process_memory.h"

namespace dynapipe::runtime {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

Millis seconds_to_ms(double s) { return Millis(static_cast<std::int64_t>(s * 1000.0)); }

// ---------------------------------------------------------------- memory

// Peak resident set size of this process since the last reset (VmHWM), in bytes. The
// high-water mark is reset at every step start by writing "5" to /proc/self/clear_refs
// (Linux >= 4.0); where that is not allowed the value is the process-lifetime peak.
std::int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }
// Resident memory now: taken before the models are built, it is what LibTorch, the data
// and the planner hold, so peak - this is what training itself added.
std::int64_t current_rss_bytes() { return status_bytes("VmRSS:");
}

// ---------------------------------------------------------------- checkpoints

// Layout under --checkpoint-dir:
//   step-<N>/rank-<r>.pt   parameters, AdamW state and CPU RNG state of rank r
//   step-<N>/meta.json     {"next_step": N, "world_size", "pp", "dp", "metrics": [rows]
//                           [, "layers_per_stage": [...] when --partition chose a non-uniform split]}
//   latest                 "step-<N>", replaced atomically once every rank has saved
void write_file_atomically(const fs::path& path, const std::string& text) {
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw Error(ErrorKind::Internal, cat("cannot write ", tmp.string()));
  }
  fs::rename(tmp, path);
}

void save_rank_state(const fs::path& file, Executor& executor) {
  torch::serialize::OutputArchive archive;
  auto params = executor.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) archive.write(cat("param/", i), params[i].detach());
  torch::serialize::OutputArchive optimizer;
  executor.optimizer().save(optimizer);
  archive.write("optimizer", optimizer);
  auto generator = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    archive.write("rng", generator.get_state());
  }
  auto tmp = file;
  tmp += ".tmp";
  archive.save_to(tmp.string());
  fs::rename(tmp, file);
}

void load_rank_state(const fs::path& file, Executor& executor) {
  if (!fs::exists(file))
    throw Error(ErrorKind::NotFound, cat("--resume: checkpoint file ", file.string(), " does not exist"));
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  auto params = executor.parameters();
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor saved;
    archive.read(cat("param/", i), saved);
    if (saved.sizes() != params[i].sizes())
      throw Error(ErrorKind::ParseError, cat(file.string(), ": parameter ", i, " has shape [",
                                             join(saved.sizes(), ", "), "], the model [",
                                             join(params[i].sizes(), ", "), "]"));
    params[i].copy_(saved);
  }
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  executor.optimizer().load(optimizer);
  torch::Tensor rng;
  archive.read("rng", rng);
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(rng);
}

std::optional<CheckpointMeta> load_checkpoint(const TrainOptions& o, const RankContext& c, Executor& executor) {
  fs::path dir(o.checkpoint_dir);
  auto latest = dir / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  auto step_dir = dir / name;
  std::ifstream meta_in(step_dir / "meta.json");
  if (!meta_in)
    throw Error(ErrorKind::NotFound, cat("--resume: ", (step_dir / "meta.json").string(), " does not exist"));
  std::stringstream text;
  text << meta_in.rdbuf();
  auto where = (step_dir / "meta.json").string();
  auto meta = checkpoint_meta_from_json(text.str(), where);
  for (auto [key, saved, now] : {std::tuple<const char*, int, int>{"world_size", meta.world_size, c.ranks.world_size()},
                                 {"pp", meta.pp, c.ranks.pp},
                                 {"dp", meta.dp, c.ranks.dp}}) {
    if (saved != now)
      throw Error(ErrorKind::InvalidArgument,
                  cat("--resume: ", where, " was written with ", key, " ", saved, ", this run has ", now));
  }
  // Stage models hold the --partition split: another split would load weights into the
  // wrong layers even where the shapes agree.
  const std::vector<int> split = layers_per_stage(o.plan.stage_layers);
  if (meta.layers_per_stage != split) {
    auto describe = [](const std::vector<int>& counts) { return counts.empty() ? std::string("uniform") : join(counts, ","); };
    throw Error(ErrorKind::InvalidArgument, cat("--resume: ", where, " was written with layers per stage ",
                                                describe(meta.layers_per_stage), ", this run has ", describe(split),
                                                " (--partition)"));
  }
  load_rank_state(step_dir / cat("rank-", c.rank, ".pt"), executor);
  return meta;
}

void save_checkpoint(const TrainOptions& o, const RankContext& c, Executor& executor,
                     const CheckpointMeta& meta, Millis timeout) {
  fs::path dir(o.checkpoint_dir);
  auto name = cat("step-", meta.next_step);
  fs::create_directories(dir / name);
  save_rank_state(dir / name / cat("rank-", c.rank, ".pt"), executor);
  c.pipe->barrier(timeout);  // every rank's file is complete
  if (c.rank == 0) {
    auto saved = meta;
    saved.world_size = c.ranks.world_size();
    saved.pp = c.ranks.pp;
    saved.dp = c.ranks.dp;
    saved.layers_per_stage = layers_per_stage(o.plan.stage_layers);
    write_file_atomically(dir / name / "meta.json", checkpoint_meta_to_json(saved));
    write_file_atomically(dir / "latest", name + "\n");
  }
  c.pipe->barrier(timeout);  // nobody runs ahead of a checkpoint that may not exist yet
}

// ---------------------------------------------------------------- per-step gathering

constexpr int kFixedFields = 6;  // loss, has_loss, wall_ms, rss_peak, held_peak, rss_peak - start
constexpr int kRowFields = kFixedFields + kNumInstructionOps;

// Everyone contributes its row; the all-reduce (a sum over a zero matrix) gives rank 0
// every rank's measurements. Also a step barrier.
torch::Tensor gather_rows(const RankContext& c, const IterationResult& r, std::int64_t rss,
                          std::int64_t start_rss, Millis timeout) {
  auto rows = torch::zeros({c.ranks.world_size(), kRowFields}, torch::kFloat64);
  auto row = rows[c.rank];
  row[0] = r.loss;
  row[1] = r.has_loss ? 1.0 : 0.0;
  row[2] = r.wall_ms;
  row[3] = static_cast<double>(rss);
  row[4] = static_cast<double>(r.peak_held_bytes);
  row[5] = static_cast<double>(std::max<std::int64_t>(0, rss - start_rss));
  for (int op = 0; op < kNumInstructionOps; ++op) row[kFixedFields + op] = r.op_ms[op];
  if (c.ranks.world_size() > 1) {
    std::vector<torch::Tensor> tensors{rows};
    c.pipe->allreduce(tensors)->wait(timeout);
    rows = tensors[0];
  }
  return rows;
}

// Per device: forward and backward ms of the step, averaged over the device's replicas.
std::vector<MeasuredStageTimes> measured_stage_times(const torch::Tensor& rows, const RankLayout& ranks) {
  auto acc = rows.accessor<double, 2>();
  std::vector<MeasuredStageTimes> devices(static_cast<std::size_t>(ranks.pp));
  const int replicas = ranks.dp;
  auto ms = [&](int rank, InstructionOp op) { return acc[rank][kFixedFields + static_cast<int>(op)]; };
  for (int rank = 0; rank < rows.size(0); ++rank) {
    MeasuredStageTimes& d = devices[static_cast<std::size_t>(ranks.stage_of(rank))];
    d.forward_ms += ms(rank, InstructionOp::Forward) / replicas;
    d.backward_ms += (ms(rank, InstructionOp::Backward) + ms(rank, InstructionOp::BackwardInput) +
                      ms(rank, InstructionOp::BackwardWeight)) / replicas;
    d.peak_memory_bytes = std::max(d.peak_memory_bytes, acc[rank][5]);
  }
  return devices;
}

StepMetrics step_metrics(std::int64_t step, const IterationPlan& plan, const torch::Tensor& rows) {
  StepMetrics m;
  m.step = step;
  auto acc = rows.accessor<double, 2>();
  double max_wall = 0, max_rss = 0, max_held = 0, max_added = 0;
  for (int r = 0; r < rows.size(0); ++r) {
    m.loss += acc[r][0];
    max_wall = std::max(max_wall, acc[r][2]);
    max_rss = std::max(max_rss, acc[r][3]);
    max_held = std::max(max_held, acc[r][4]);
    max_added = std::max(max_added, acc[r][5]);
    for (int op = 0; op < kNumInstructionOps; ++op) {
      double ms = acc[r][kFixedFields + op];
      if (ms > 0) {
        double& slot = m.op_ms[std::string(instruction_op_name(static_cast<InstructionOp>(op)))];
        slot = std::max(slot, ms);
      }
    }
  }
  for (const auto& replica : plan.replicas) {
    for (const auto& mb : replica.microbatches) {
      m.real_tokens += mb.real_tokens;
      m.padded_tokens += mb.shape.tokens();
    }
    m.microbatches += static_cast<int>(replica.microbatches.size());
    for (auto b : replica.est_peak_memory_bytes) m.est_peak_memory_bytes = std::max(m.est_peak_memory_bytes, b);
    if (m.schedule.empty()) m.schedule = schedule_kind_name(replica.schedule);
  }
  m.step_time_s = max_wall / 1000.0;
  m.est_step_time_s = plan.est_iteration_ms / 1000.0;
  m.tokens_per_s = m.step_time_s > 0 ? static_cast<double>(m.real_tokens) / m.step_time_s : 0;
  m.planning_ms = plan.planning_ms;
  m.peak_memory_bytes = static_cast<std::int64_t>(max_rss);
  m.held_peak_bytes = static_cast<std::int64_t>(max_held);
  m.peak_memory_above_start_bytes = static_cast<std::int64_t>(max_added);
  return m;
}

// The program of `rank` in a decoded plan, checked against the job's shape.
const ExecutorProgram& program_of(const IterationPlan& plan, const RankContext& c, std::int64_t step) {
  auto where = cat("plan store: iteration ", step, ", rank ", c.rank, ": ");
  if (static_cast<int>(plan.replicas.size()) != c.ranks.dp)
    throw Error(ErrorKind::ParseError, cat(where, "plan must have ", c.ranks.dp, " replicas, got ", plan.replicas.size()));
  const auto& replica = plan.replicas[c.ranks.replica_of(c.rank)];
  if (static_cast<int>(replica.executors.size()) != c.ranks.ranks_per_replica())
    throw Error(ErrorKind::ParseError, cat(where, "replica must have ", c.ranks.ranks_per_replica(),
                                           " executors, got ", replica.executors.size()));
  return replica.executors[c.ranks.local_index_of(c.rank)];
}

}  // namespace

// ---------------------------------------------------------------- the loop

TrainSummary train_rank(const TrainOptions& options, const RankContext& c, const TrainHooks& hooks) {
  DYNAPIPE_CHECK(c.pipe && c.store, "train_rank needs a communicator and a plan store");
  auto comm_timeout = seconds_to_ms(options.comm_timeout_s);
  auto store_timeout = seconds_to_ms(options.store_timeout_s);
  try {
    const bool keep_freed = !options.release_freed_memory;
    const bool freed_memory_kept = keep_freed_host_memory(keep_freed) && keep_freed;
    const std::int64_t start_rss = current_rss_bytes();
    const int device = c.ranks.stage_of(c.rank);
    std::map<int, std::shared_ptr<StageModel>> stages;
    for (int s = device; s < hooks.num_stages; s += c.ranks.pp) stages[s] = hooks.make_stage(s);
    ExecutorConfig config{.rank = c.rank, .ranks = c.ranks,
                          .num_stages = hooks.num_stages, .comm_timeout = comm_timeout,
                          .lr = options.lr, .weight_decay = options.weight_decay,
                          .zero = options.plan.zero == 1,
                          .debug_no_weight_stash = options.debug_no_weight_stash,
                          // Cached freed pages count in resident memory: a limit the user
                          // set bounds them too (the device's own is the machine's).
                          .host_cache_limit_bytes = gib_to_bytes(options.plan.memory_limit_gib)};
    Executor executor(config, stages, *c.pipe, c.dp_group, hooks.collate);

    CheckpointMeta progress_so_far;
    if (options.resume) {
      if (auto meta = load_checkpoint(options, c, executor)) {
        progress_so_far = std::move(*meta);
      } else if (c.rank == 0) {
        std::fprintf(stderr, "--resume: no checkpoint in %s yet; starting at step 0\n",
                     options.checkpoint_dir.c_str());
      }
    }
    const std::int64_t first = progress_so_far.next_step;
    std::vector<StepMetrics>& rows = progress_so_far.rows;

    std::optional<PlanAhead> planners;
    std::optional<MetricsFile> metrics;
    std::optional<Progress> progress;
    if (c.rank == 0) {
      DYNAPIPE_CHECK(static_cast<bool>(hooks.produce_plan), "rank 0 needs a planner");
      planners.emplace(*c.store, hooks.produce_plan, first, options.steps, options.plan_ahead,
                       options.planner_threads);
      if (!options.metrics_path.empty()) metrics.emplace(options.metrics_path, rows);
      progress.emplace(options.steps, options.progress);
    }
    for (std::int64_t step = first; step < options.steps; ++step) {
      std::string bytes;
      if (planners) {
        planners->advance(step);
        planners->check(step);
        try {
          bytes = c.store->get(step, c.rank, store_timeout);
        } catch (const Error&) {
          planners->check(step);  // a planning error is the better message (and exit code)
          throw;
        }
      } else {
        bytes = c.store->get(step, c.rank, store_timeout);
      }
      IterationPlan plan = decode_plan(bytes, step, c.rank);
      c.store->release(step, c.ranks.world_size());
      const auto& program = program_of(plan, c, step);
      double target_tokens = 0;
      for (const auto& r : plan.replicas)
        for (const auto& mb : r.microbatches) target_tokens += static_cast<double>(mb.target_tokens);
      reset_peak_rss();
      auto result = executor.run({.iteration = step,
                                  .replica = &plan.replicas[c.ranks.replica_of(c.rank)],
                                  .program = &program,
                                  .loss_scale = target_tokens > 0 ? 1.0 / target_tokens : 0.0});
      auto gathered = gather_rows(c, result, peak_rss_bytes(), start_rss, comm_timeout);
      if (c.rank == 0) {
        auto m = step_metrics(step, plan, gathered);
        if (hooks.observe_step) hooks.observe_step(plan, measured_stage_times(gathered, c.ranks));
        rows.push_back(m);
        if (metrics) metrics->append(m);
        progress->update(m);
      }
      bool last = step + 1 == options.steps;
      if (!options.checkpoint_dir.empty() &&
          ((options.checkpoint_every > 0 && (step + 1) % options.checkpoint_every == 0) || last)) {
        progress_so_far.next_step = step + 1;
        save_checkpoint(options, c, executor, progress_so_far, comm_timeout);
      }
    }
    if (c.rank == 0) {
      progress->done();
      if (metrics) metrics->finish(rows);
      TrainSummary summary = summarize_steps(rows);
      if (hooks.describe_refinement) summary.cost_calibration = hooks.describe_refinement();
      summary.freed_memory_kept = freed_memory_kept;
      return summary;
    }
    return {};
  } catch (const std::exception& e) {
    try {
      c.store->report_failure(cat("rank ", c.rank, ": ", e.what()));
    } catch (...) {
    }
    throw;
  }
}

// ---------------------------------------------------------------- processes

namespace {

// The runtime computes on the CPU and communicates with Gloo. A CUDA device needs a
// LibTorch with CUDA and c10d's NCCL: say so plainly instead of failing later.
void check_device(const std::string& device) {
  std::optional<c10::Device> parsed;
  try {
    parsed.emplace(device);
  } catch (const std::exception&) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--device must be cpu or cuda[:N], got \"", device, "\""));
  }
  if (parsed->is_cpu()) return;
  if (!parsed->is_cuda()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("--device must be cpu or cuda[:N], got \"", device, "\""));
  }
  throw Error(ErrorKind::Unsupported,
              cat("--device ", device, ": ",
                  torch::cuda::is_available()
                      ? "this runtime has no NCCL communicator yet; use --device cpu"
                      : "this LibTorch build has no CUDA (CPU-only); use --device cpu"));
}

}  // namespace

void TrainOptions::validate() const {
  auto bad = [](const std::string& flag, const std::string& expected, const auto& got) {
    throw Error(ErrorKind::InvalidArgument, cat(flag, " must be ", expected, ", got ", got));
  };
  if (steps < 1) bad("--steps", ">= 1", steps);
  if (threads_per_rank < 1) bad("--threads-per-rank", ">= 1", threads_per_rank);
  if (plan_ahead < 1) bad("--plan-ahead", ">= 1", plan_ahead);
  if (planner_threads < 1) bad("--planner-threads", ">= 1", planner_threads);
  if (!(dropout >= 0 && dropout < 1)) bad("--dropout", "in [0, 1)", dropout);
  if (!(lr > 0)) bad("--lr", "> 0", lr);
  if (!(weight_decay >= 0)) bad("--weight-decay", ">= 0", weight_decay);
  if (!(comm_timeout_s > 0)) bad("--comm-timeout", "> 0 seconds", comm_timeout_s);
  if (!(store_timeout_s > 0)) bad("--store-timeout", "> 0 seconds", store_timeout_s);
  if (checkpoint_every < 0) bad("--checkpoint-every", ">= 0", checkpoint_every);
  if (resume && checkpoint_dir.empty()) bad("--resume", "used with --checkpoint-dir", "none");
  if (plan.pp < 1) bad("--pp", ">= 1", plan.pp);
  if (plan.dp < 1) bad("--dp", ">= 1", plan.dp);
  check_device(device);
}

namespace {

// GLOO_SOCKET_IFNAME (the name torch.distributed reads) picks the interface; a loopback
// master keeps everything on 127.0.0.1; otherwise Gloo uses this host's own address.
GlooDevice gloo_device_for(const DistributedEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    return {.interface = ifname, .hostname = ""};
  }
  const bool loopback = env.master_addr == "127.0.0.1" || env.master_addr == "localhost";
  return {.interface = "", .hostname = loopback ? "127.0.0.1" : ""};
}

}  // namespace

TrainSummary run_rank_process(const TrainOptions& options, const DistributedEnv& env,
                              const HooksFactory& make_hooks) {
  const RankLayout ranks = rank_layout_of(options.plan);
  const int world = ranks.world_size();
  if (env.world_size != world) {
    throw Error(
        ErrorKind::InvalidArgument,
        ranks.stage_replicas.empty()
            ? cat("WORLD_SIZE must be --pp x --dp = ", world, ", got ", env.world_size)
            : cat("WORLD_SIZE must be --dp x the sum of --replicas = ", ranks.dp, " x (",
                  join(ranks.stage_replicas, " + "), ") = ", world, ", got ", env.world_size));
  }
  at::set_num_threads(options.threads_per_rank);
  auto store_timeout = seconds_to_ms(options.store_timeout_s);
  auto comm_timeout = seconds_to_ms(options.comm_timeout_s);
  std::string run_id = options.run_id;
  if (run_id.empty()) {
    const char* id = std::getenv("DYNAPIPE_RUN_ID");
    run_id = id && *id ? id : cat("run-", env.master_port);
  }
  auto store = make_rendezvous_store(env.master_addr, env.master_port, env.rank == 0, env.store_bind_addr,
                                     store_timeout);
  std::shared_ptr<KeyValue> kv = key_value_over(store);
  auto plan_store = open_plan_store({.url = options.plan_store,
                                     .password = options.plan_store_password,
                                     .run_id = run_id,
                                     .timeout = store_timeout,
                                     .embedded = kv});
  if (env.rank == 0) plan_store->clear_failure();
  const GlooDevice device = gloo_device_for(env);
  std::unique_ptr<Communicator> pipe, dp_group;
  if (world > 1) pipe = make_gloo_communicator(store, run_id + "/pipe", env.rank, world, comm_timeout, device);
  else pipe = std::move(make_local_communicators(1)[0]);
  // The ranks holding this rank's stage (every replica and stage-replica) reduce its gradients.
  const int stage = ranks.stage_of(env.rank);
  if (ranks.stage_group_size(stage) > 1)
    dp_group =
        make_gloo_communicator(store, cat(run_id, "/dp", stage), ranks.stage_group_rank(env.rank),
                               ranks.stage_group_size(stage), comm_timeout, device);
  auto hooks = make_hooks(options, env.rank);
  RankContext context{.rank = env.rank, .ranks = ranks,
                      .pipe = pipe.get(), .dp_group = dp_group.get(), .store = plan_store.get()};
  return train_rank(options, context, hooks);
}

TrainSummary run_training(const TrainOptions& options) {
  options.validate();
  if (const auto env = distributed_env_from_environment()) {
    auto summary = run_rank_process(options, *env, make_default_hooks);
    const char* launched = std::getenv("DYNAPIPE_LAUNCHED");
    summary.is_reporter = env->rank == 0 && !(launched && std::string(launched) == "1");
    if (env->rank == 0) {
      if (const char* file = std::getenv("DYNAPIPE_SUMMARY_FILE"); file && *file)
        write_file_atomically(file, summary_to_json(summary));
    }
    return summary;
  }
  const int world = rank_layout_of(options.plan).world_size();
  if (world == 1) {
    // Nothing to launch: this process is the job (and reports bad input as it builds it).
    auto summary = run_rank_process(options, DistributedEnv{.rank = 0, .world_size = 1, .master_port = pick_free_port()},
                                    make_default_hooks);
    summary.is_reporter = true;
    return summary;
  }
  // Reject bad input here, before any rank starts, instead of once per rank. Joining ranks
  // (RANK set, above) were started by this launcher, which has checked, or by the user's
  // own, in which case each rank reports the same one-line error.
  check_training_inputs(options);
  if (options.worker_command.empty())
    throw Error(ErrorKind::InvalidArgument, "run_training: worker_command must name the program that starts a rank");
  auto summary_file = fs::temp_directory_path() / cat("dynapipe-summary-", ::getpid(), ".json");
  fs::remove(summary_file);
  bool tty = ::isatty(2);
  launch_local({.command = options.worker_command,
                .world_size = world,
                .env = {{"DYNAPIPE_SUMMARY_FILE", summary_file.string()},
                        {"DYNAPIPE_RUN_ID", cat("run-", ::getpid(), "-", Clock::now().time_since_epoch().count())},
                        {"DYNAPIPE_STDERR_TTY", tty ? "1" : "0"},
                        {"DYNAPIPE_LAUNCHED", "1"}},
                .kill_grace = seconds_to_ms(options.kill_grace_s)});
  std::ifstream in(summary_file);
  if (!in) throw Error(ErrorKind::Internal, cat("rank 0 wrote no summary to ", summary_file.string()));
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(summary_file);
  auto summary = summary_from_json(text.str());
  summary.is_reporter = true;
  return summary;
}

}  // namespace dynapipe::runtime
