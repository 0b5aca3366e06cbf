#include "runtime/exec/executor.h"

#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>

#include "dynapipe/core/error.h"
#include "runtime/exec/host_allocator.h"
#include "runtime/model/reference_trainer.h"

namespace dynapipe::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using Op = InstructionOp;

std::string_view op_name(Op op) { return instruction_op_name(op); }

std::string describe(const Instruction& in) {
  std::string s(op_name(in.op));
  if (in.mb >= 0) s += cat(" mb ", in.mb);
  if (in.stage >= 0) s += cat(" stage ", in.stage);
  if (in.peer >= 0) s += cat(" peer ", in.peer);
  if (!in.shape.empty()) s += cat(" shape [", join(in.shape, ", "), "]");
  if (in.buffer >= 0) s += cat(" buffer ", in.buffer);
  return s;
}

bool is_start(Op op) { return is_comm_start(op); }
bool is_finish(Op op) { return is_communication(op) && !is_comm_start(op); }
// The Start a Finish waits for (their enum values are adjacent: Start, Finish).
Op start_of(Op finish) { return static_cast<Op>(static_cast<int>(finish) - 1); }

// A communication instruction's `stage` may name either end of the transfer; the local
// end is the one this executor holds (adjacent stages are always on different devices
// when pp > 1, so this is unambiguous). Activations flow s -> s+1, gradients s+1 -> s.
std::optional<int> local_stage(const Instruction& in, const std::set<int>& local) {
  if (in.stage < 0) {
    if (local.size() == 1) return *local.begin();
    return std::nullopt;
  }
  if (local.count(in.stage)) return in.stage;
  int other = -1;
  switch (in.op) {
    case Op::RecvActivationStart: case Op::RecvActivationFinish: other = in.stage + 1; break;
    case Op::SendActivationStart: case Op::SendActivationFinish: other = in.stage - 1; break;
    case Op::RecvGradStart: case Op::RecvGradFinish: other = in.stage - 1; break;
    case Op::SendGradStart: case Op::SendGradFinish: other = in.stage + 1; break;
    default: return std::nullopt;
  }
  if (local.count(other)) return other;
  return std::nullopt;
}

using Key = std::pair<int, int>;  // (mb, local stage)

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
}

}  // namespace

// ---------------------------------------------------------------- validation

std::vector<int> zero_owner(const std::vector<std::int64_t>& numels, int dp) {
  DYNAPIPE_CHECK(dp >= 1, cat("zero_owner: dp ", dp));
  std::vector<std::size_t> order(numels.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(dp), 0);
  std::vector<int> owner(numels.size(), 0);
  for (std::size_t i : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owner[i] = static_cast<int>(lightest);
    load[static_cast<std::size_t>(lightest)] += numels[i];
  }
  return owner;
}

void validate_program(const ExecutorProgram& program, const ReplicaPlan& replica,
                      std::int64_t iteration, const ExecutorConfig& config,
                      const std::set<int>& local_stages) {
  auto where = cat("iteration ", iteration, ", rank ", config.rank);
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::ParseError, cat(where, ": ", what));
  };
  if (program.rank != config.rank) fail(cat("program rank must be ", config.rank, ", got ", program.rank));
  const RankLayout& ranks = config.ranks;
  if (program.device != ranks.stage_of(config.rank))
    fail(cat("program device must be ", ranks.stage_of(config.rank), ", got ", program.device));
  if (program.replica != ranks.replica_of(config.rank))
    fail(cat("program replica must be ", ranks.replica_of(config.rank), ", got ", program.replica));
  if (program.stage_replica != ranks.stage_replica_of(config.rank))
    fail(cat("program stage_replica must be ", ranks.stage_replica_of(config.rank), ", got ",
             program.stage_replica));
  std::set<int> mb_ids;
  for (const auto& mb : replica.microbatches) mb_ids.insert(mb.id);
  // Outstanding Starts per (op, peer) with their micro-batch ids, to match Finishes.
  std::map<std::pair<Op, int>, std::deque<int>> open;
  for (std::size_t k = 0; k < program.instructions.size(); ++k) {
    const auto& in = program.instructions[k];
    auto at = [&](const std::string& what) { fail(cat("instruction ", k, " (", describe(in), "): ", what)); };
    if (static_cast<int>(in.op) >= kNumInstructionOps) at(cat("op must be < ", kNumInstructionOps));
    bool needs_mb = is_compute(in.op) || is_start(in.op);
    if (needs_mb && !mb_ids.count(in.mb))
      at(cat("mb must be one of this replica's ", mb_ids.size(), " micro-batch ids, got ", in.mb));
    if (!needs_mb && in.mb >= 0 && !mb_ids.count(in.mb))
      at(cat("mb must be a micro-batch id of this replica or -1, got ", in.mb));
    if (needs_mb && ranks.stage_replica_of_mb(program.device, in.mb) != program.stage_replica)
      at(cat("mb ", in.mb, " must run on stage-replica ",
             ranks.stage_replica_of_mb(program.device, in.mb),
             " (round robin), this is stage-replica ", program.stage_replica));
    if (in.buffer < -1) at(cat("buffer must be >= -1, got ", in.buffer));
    if ((in.op == Op::Forward || in.op == Op::Backward || in.op == Op::BackwardInput ||
         in.op == Op::BackwardWeight) &&
        !local_stages.count(in.stage))
      at(cat("stage must be one this executor holds (", join(local_stages, ", "), "), got ", in.stage));
    if (in.op == Op::LoadInput && in.stage >= 0 && !local_stages.count(in.stage))
      at(cat("stage must be one this executor holds or -1, got ", in.stage));
    if (is_start(in.op) || is_finish(in.op)) {
      if (in.peer < 0 || in.peer >= ranks.world_size() || in.peer == config.rank)
        at(cat("peer must be another rank in [0, ", ranks.world_size(), "), got ", in.peer));
      if (ranks.replica_of(in.peer) != ranks.replica_of(config.rank))
        at(cat("peer must be in replica ", ranks.replica_of(config.rank), ", got rank ", in.peer,
               " of replica ", ranks.replica_of(in.peer)));
      if (!local_stage(in, local_stages))
        at(cat("stage must name a stage of this executor (", join(local_stages, ", "),
               ") or its neighbour, got ", in.stage));
    }
    if (is_start(in.op)) {
      if (in.shape.empty() || in.shape.size() > 8)
        at(cat("shape must have 1 to 8 dimensions, got ", in.shape.size()));
      std::int64_t numel = 1;
      for (auto d : in.shape) {
        if (d < 0) at(cat("shape dimensions must be >= 0, got ", d));
        if (d > 0 && numel > (std::int64_t{1} << 36) / d)
          at("shape must have at most 2^36 elements");
        numel *= d;
      }
      open[{in.op, in.peer}].push_back(in.mb);
    }
    if (is_finish(in.op)) {
      auto& q = open[{start_of(in.op), in.peer}];
      auto it = std::find_if(q.begin(), q.end(), [&](int mb) { return in.mb < 0 || mb == in.mb; });
      if (it == q.end()) at(cat("must follow a matching ", op_name(start_of(in.op)), " to peer ", in.peer));
      q.erase(it);
    }
  }
}

// ---------------------------------------------------------------- executor

struct Executor::Impl {
  ExecutorConfig config;
  std::map<int, std::shared_ptr<StageModel>> stages;
  std::set<int> local;
  Communicator& pipe;
  Communicator* dp;
  CollateFn collate;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  // Per-iteration state.
  struct Forwarded {
    torch::Tensor input;   // requires grad (undefined on stage 0)
    torch::Tensor output;  // hidden, or undefined on the last stage
    torch::Tensor loss;    // last stage only
    int version = -1;      // >= 0: ran without autograd on this weight version; the
                           // backward re-runs it from `input`
  };
  struct Pending {
    Op op;
    int mb;
    int stage;
    int peer;
    std::unique_ptr<Work> work;
    torch::Tensor tensor;
    int buffer;
  };
  std::map<int, MicroBatchTensors> batches;
  std::map<Key, Forwarded> forwarded;
  std::map<Key, DeferredWeightGrads> deferred;  // BackwardInput done, BackwardWeight pending
  std::vector<torch::Tensor> params;  // every parameter of the local stages, in a fixed order
  std::vector<int> owner;             // ZeRO-1: the dp replica that steps params[i]
  std::map<Key, torch::Tensor> act_in, grad_in, act_out, grad_out;
  std::deque<Pending> pending;
  std::map<int, std::vector<std::pair<std::map<Key, torch::Tensor>*, Key>>> buffers;
  const ReplicaPlan* replica = nullptr;
  double loss_scale = 1.0;
  IterationResult result;
  // Weight versions of this iteration: the current one (= the live parameters) and the
  // stashed copies, each parallel to `params`.
  int version = 0;
  std::map<int, std::vector<torch::Tensor>> stashed;

  Impl(ExecutorConfig c, std::map<int, std::shared_ptr<StageModel>> s, Communicator& p,
       Communicator* d, CollateFn f)
      : config(c), stages(std::move(s)), pipe(p), dp(d), collate(std::move(f)) {
    for (const auto& [stage, model] : stages) local.insert(stage);
    for (const auto& [stage, model] : stages)
      for (auto& p : model->parameters()) params.push_back(p);
    std::vector<torch::Tensor> stepped = params;
    if (sharded()) {
      std::vector<std::int64_t> numels;
      for (const auto& p : params) numels.push_back(p.numel());
      owner = zero_owner(numels, dp->size());
      stepped.clear();
      for (std::size_t i = 0; i < params.size(); ++i)
        if (owner[i] == dp->rank()) stepped.push_back(params[i]);
    }
    TrainerOptions adamw;
    adamw.lr = config.lr;
    adamw.weight_decay = config.weight_decay;
    optimizer = make_adamw(stepped, adamw);
  }

  bool sharded() const { return config.zero && dp != nullptr && dp->size() > 1; }

  void reset() {
    batches.clear();
    forwarded.clear();
    deferred.clear();
    act_in.clear();
    grad_in.clear();
    act_out.clear();
    grad_out.clear();
    pending.clear();
    buffers.clear();
    result = IterationResult{};
    version = 0;
    stashed.clear();
  }

  std::int64_t held_bytes() const {
    std::int64_t total = 0;
    for (const auto* m : {&act_in, &grad_in, &act_out, &grad_out})
      for (const auto& [k, t] : *m) total += bytes_of(t);
    for (const auto& [k, f] : forwarded) {
      total += bytes_of(f.output);
      if (f.version >= 0) total += bytes_of(f.input);
    }
    for (const auto& p : pending) total += bytes_of(p.tensor);
    for (const auto& [v, copy] : stashed)
      for (const auto& t : copy) total += bytes_of(t);
    return total;
  }

  const MicroBatch& microbatch(int id) const {
    for (const auto& mb : replica->microbatches)
      if (mb.id == id) return mb;
    throw Error(ErrorKind::ParseError, cat("micro-batch ", id, " is not in this replica's plan"));
  }

  MicroBatchTensors& batch(int mb) {
    auto it = batches.find(mb);
    if (it == batches.end()) {
      auto tensors = collate(microbatch(mb));
      tensors.loss_scale = loss_scale;
      it = batches.emplace(mb, std::move(tensors)).first;
    }
    return it->second;
  }

  void remember_buffer(int buffer, std::map<Key, torch::Tensor>* map, Key key) {
    if (buffer >= 0) buffers[buffer].emplace_back(map, key);
  }

  static torch::Tensor take(std::map<Key, torch::Tensor>& map, Key key, const char* what) {
    auto it = map.find(key);
    if (it == map.end())
      throw Error(ErrorKind::ParseError,
                  cat("no ", what, " for mb ", key.first, " stage ", key.second,
                      " (is its Recv/Forward/Backward missing from the plan?)"));
    auto t = it->second;
    map.erase(it);
    return t;
  }

  // A tensor must not be read before its receive completed: if the plan forgot the
  // *Finish, wait here rather than read garbage.
  void await_recv(Op start_op, Key key) {
    auto it = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) {
      return p.op == start_op && p.mb == key.first && p.stage == key.second;
    });
    if (it == pending.end()) return;
    auto work = std::move(it->work);
    pending.erase(it);
    work->wait(config.comm_timeout);
  }

  // The micro-batch's recompute mode, set before each forward: Full's checkpoint and
  // Selective's stored tensors are decided while the forward runs.
  void use_recompute_of(const Instruction& in) {
    const MicroBatch& mb = replica->microbatches.at(static_cast<std::size_t>(in.mb));
    stages.at(in.stage)->set_recompute(recompute_of(mb, replica->recompute));
  }

  void forward(const Instruction& in) {
    Key key{in.mb, in.stage};
    await_recv(Op::RecvActivationStart, key);
    if (forwarded.count(key))
      throw Error(ErrorKind::ParseError, cat("mb ", in.mb, " stage ", in.stage, " ran forward twice"));
    Forwarded f;
    if (in.stage > 0) {
      // Same-device link (pp == 1 with several virtual stages): no Send/Recv in the plan,
      // the previous local stage's output is the input.
      Key prev{in.mb, in.stage - 1};
      bool linked = !act_in.count(key) && local.count(in.stage - 1) && act_out.count(prev);
      f.input = linked ? take(act_out, prev, "activation") : take(act_in, key, "received activation");
      if (in.version < 0) f.input.requires_grad_(true);
    }
    StageOutput out;
    use_recompute_of(in);
    if (in.version >= 0) {
      // Versioned: no graph now (a step may come before the backward, which re-runs it).
      f.version = in.version;
      with_version(in.version, [&] {
        torch::NoGradGuard no_grad;
        out = stages.at(in.stage)->forward(f.input, batch(in.mb));
      });
    } else {
      out = stages.at(in.stage)->forward(f.input, batch(in.mb));
    }
    bool last = in.stage == config.num_stages - 1;
    if (last) {
      DYNAPIPE_CHECK(out.loss.defined(), cat("stage ", in.stage, " is last but returned no loss"));
      f.loss = out.loss;
      result.loss += out.loss.item<double>();
      result.has_loss = true;
    } else {
      DYNAPIPE_CHECK(out.hidden.defined(), cat("stage ", in.stage, " returned no activation"));
      f.output = out.hidden;
      act_out[key] = out.hidden.detach();
      remember_buffer(in.buffer, &act_out, key);
    }
    if (f.version >= 0) f.output = torch::Tensor();  // the backward recomputes it
    forwarded.emplace(key, std::move(f));
  }

  // The one place backward is split: Full runs autograd for input and weight gradients;
  // Input runs it with the linear layers' weight gradients deferred (backward_input),
  // and the matching Weight instruction accumulates them (flush), as zero-bubble does.
  enum class Part { Full, Input, Weight };
  void backward(const Instruction& in, Part part) {
    Key key{in.mb, in.stage};
    if (part == Part::Weight) {
      auto it = deferred.find(key);
      if (it == deferred.end())
        throw Error(ErrorKind::ParseError, cat("mb ", in.mb, " stage ", in.stage,
                                               " runs BackwardWeight before its BackwardInput"));
      it->second.flush();
      deferred.erase(it);
      return;
    }
    auto it = forwarded.find(key);
    if (it == forwarded.end())
      throw Error(ErrorKind::ParseError, cat("mb ", in.mb, " stage ", in.stage,
                                             " runs backward before its forward"));
    Forwarded f = std::move(it->second);
    forwarded.erase(it);
    if (f.version >= 0) return versioned_backward(in, std::move(f));
    torch::Tensor output = f.loss, grad;
    if (!f.loss.defined()) {
      await_recv(Op::RecvGradStart, key);
      Key next{in.mb, in.stage + 1};
      bool linked = !grad_in.count(key) && local.count(in.stage + 1) && grad_out.count(next);
      grad = linked ? take(grad_out, next, "gradient") : take(grad_in, key, "received gradient");
      if (grad.sizes() != f.output.sizes())
        throw Error(ErrorKind::ParseError,
                    cat("gradient for mb ", in.mb, " stage ", in.stage, " has shape [",
                        join(grad.sizes(), ", "), "], its activation [",
                        join(f.output.sizes(), ", "), "]"));
      output = f.output;
    }
    if (part == Part::Input) {
      deferred.emplace(key, backward_input(output, grad));
    } else if (grad.defined()) {
      torch::autograd::backward({output}, {grad});
    } else {
      output.backward();
    }
    if (in.stage > 0) {
      auto g = f.input.grad();
      DYNAPIPE_CHECK(g.defined(), cat("stage ", in.stage, " input received no gradient"));
      grad_out[key] = g;
      remember_buffer(in.buffer, &grad_out, key);
    }
  }

  // Runs `body` with the parameters holding weight version `v`: the live values when v is
  // current, else the stashed copy, swapped in and back out (the body's autograd graph,
  // if any, must not outlive it).
  template <typename Body>
  void with_version(int v, Body&& body) {
    if (v == version || config.debug_no_weight_stash) {
      body();
      return;
    }
    auto it = stashed.find(v);
    if (it == stashed.end())
      throw Error(ErrorKind::ParseError, cat("weight version ", v, " must be the current one (",
                                             version, ") or stashed, got neither"));
    std::vector<torch::Tensor> live;
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) {
        live.push_back(params[i].detach().clone());
        params[i].detach().copy_(it->second[i]);
      }
    }
    auto restore = [&] {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(live[i]);
    };
    try {
      body();
    } catch (...) {
      restore();
      throw;
    }
    restore();
  }

  // The backward of a versioned forward: re-run the forward on its version with autograd
  // from the kept input, then backward; parameter gradients accumulate into .grad.
  void versioned_backward(const Instruction& in, Forwarded f) {
    Key key{in.mb, in.stage};
    if (in.version != f.version)
      throw Error(ErrorKind::ParseError, cat("mb ", in.mb, " stage ", in.stage,
                                             " backward uses weight version ", in.version,
                                             ", its forward used ", f.version));
    const bool last = in.stage == config.num_stages - 1;
    torch::Tensor grad;
    if (!last) {
      await_recv(Op::RecvGradStart, key);
      Key next{in.mb, in.stage + 1};
      bool linked = !grad_in.count(key) && local.count(in.stage + 1) && grad_out.count(next);
      grad = linked ? take(grad_out, next, "gradient") : take(grad_in, key, "received gradient");
    }
    torch::Tensor input;
    if (f.input.defined()) input = f.input.detach().requires_grad_(true);
    use_recompute_of(in);
    with_version(in.version, [&] {
      StageOutput out = stages.at(in.stage)->forward(input, batch(in.mb));
      if (last) {
        out.loss.backward();
        return;
      }
      if (grad.sizes() != out.hidden.sizes())
        throw Error(ErrorKind::ParseError,
                    cat("gradient for mb ", in.mb, " stage ", in.stage, " has shape [",
                        join(grad.sizes(), ", "), "], its activation [",
                        join(out.hidden.sizes(), ", "), "]"));
      torch::autograd::backward({out.hidden}, {grad});
    });
    if (in.stage > 0) {
      auto g = input.grad();
      DYNAPIPE_CHECK(g.defined(), cat("stage ", in.stage, " input received no gradient"));
      grad_out[key] = g;
      remember_buffer(in.buffer, &grad_out, key);
    }
  }

  void stash_weights(const Instruction& in) {
    if (in.version != version || stashed.count(in.version))
      throw Error(ErrorKind::ParseError, cat("StashWeights must copy the current version ", version,
                                             " once, got version ", in.version));
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> copy;
    for (const auto& p : params) copy.push_back(p.detach().clone());
    stashed.emplace(in.version, std::move(copy));
  }

  void free_weights(const Instruction& in) {
    if (!stashed.erase(in.version))
      throw Error(ErrorKind::ParseError,
                  cat("FreeWeights must free a stashed version, got version ", in.version));
  }

  void start(const Instruction& in) {
    int stage = *local_stage(in, local);
    Key key{in.mb, stage};
    std::vector<std::int64_t> shape = in.shape;
    Pending p{in.op, in.mb, stage, in.peer, nullptr, {}, in.buffer};
    auto check_shape = [&](const torch::Tensor& t, const char* what) {
      if (t.sizes() != torch::IntArrayRef(shape))
        throw Error(ErrorKind::ParseError,
                    cat(what, " of mb ", in.mb, " stage ", stage, " has shape [",
                        join(t.sizes(), ", "), "], the plan says [", join(shape, ", "), "]"));
    };
    switch (in.op) {
      case Op::SendActivationStart:
        p.tensor = take(act_out, key, "activation to send").contiguous();
        check_shape(p.tensor, "activation");
        p.work = pipe.send(p.tensor, in.peer);
        break;
      case Op::SendGradStart:
        p.tensor = take(grad_out, key, "gradient to send").contiguous();
        check_shape(p.tensor, "gradient");
        p.work = pipe.send(p.tensor, in.peer);
        break;
      case Op::RecvActivationStart:
      case Op::RecvGradStart: {
        auto& into = in.op == Op::RecvActivationStart ? act_in : grad_in;
        if (into.count(key))
          throw Error(ErrorKind::ParseError, cat("mb ", in.mb, " stage ", stage, " received twice"));
        p.tensor = torch::empty(shape, torch::kFloat32);
        p.work = pipe.recv(p.tensor, in.peer);
        into[key] = p.tensor;
        remember_buffer(in.buffer, &into, key);
        break;
      }
      default:
        DYNAPIPE_CHECK(false, "start() on a non-start op");
    }
    pending.push_back(std::move(p));
  }

  void finish(const Instruction& in) {
    Op want = start_of(in.op);
    auto stage = local_stage(in, local);
    auto it = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) {
      return p.op == want && p.peer == in.peer && (in.mb < 0 || p.mb == in.mb) &&
             (in.stage < 0 || !stage || p.stage == *stage);
    });
    if (it == pending.end())
      throw Error(ErrorKind::ParseError, cat(op_name(in.op), " has no pending ", op_name(want)));
    auto work = std::move(it->work);
    pending.erase(it);
    work->wait(config.comm_timeout);
  }

  void free_buffer(const Instruction& in) {
    if (in.buffer >= 0) {
      if (auto it = buffers.find(in.buffer); it != buffers.end()) {
        for (auto& [map, key] : it->second) map->erase(key);
        buffers.erase(it);
      }
    }
  }

  // Weight gradients still deferred would be missing from the reduction and the step.
  void require_weight_grads_flushed(const char* before) const {
    if (deferred.empty()) return;
    auto [mb, stage] = deferred.begin()->first;
    throw Error(ErrorKind::ParseError, cat(before, " before BackwardWeight of mb ", mb, " stage ", stage));
  }

  void reduce_grads() {
    require_weight_grads_flushed("ReduceGrads");
    if (dp == nullptr || dp->size() <= 1) return;
    std::vector<torch::Tensor> grads;
    for (const auto& [stage, model] : stages) {
      for (auto& p : model->parameters()) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        grads.push_back(p.grad());
      }
    }
    dp->allreduce(grads)->wait(config.comm_timeout);
  }

  void step() {
    require_weight_grads_flushed("OptimizerStep");
    optimizer->step();
    optimizer->zero_grad();
    if (sharded()) sync_from_owners();
    ++version;
  }

  // After a ZeRO-1 step only the owner holds a parameter's new value. Every replica but
  // the owner contributes zeros to a sum all-reduce, so each gets the owner's value
  // exactly (x + 0 = x in floating point).
  void sync_from_owners() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> values;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (owner[i] != dp->rank()) params[i].zero_();
      values.push_back(params[i]);
    }
    dp->allreduce(values)->wait(config.comm_timeout);
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
  }

  void execute(const Instruction& in) {
    switch (in.op) {
      case Op::LoadInput: batch(in.mb); break;
      case Op::Forward: forward(in); break;
      case Op::Backward: backward(in, Part::Full); break;
      case Op::BackwardInput: backward(in, Part::Input); break;
      case Op::BackwardWeight: backward(in, Part::Weight); break;
      case Op::SendActivationStart:
      case Op::RecvActivationStart:
      case Op::SendGradStart:
      case Op::RecvGradStart: start(in); break;
      case Op::SendActivationFinish:
      case Op::RecvActivationFinish:
      case Op::SendGradFinish:
      case Op::RecvGradFinish: finish(in); break;
      case Op::FreeBuffer: free_buffer(in); break;
      case Op::ReduceGrads: reduce_grads(); break;
      case Op::OptimizerStep: step(); break;
      case Op::StashWeights: stash_weights(in); break;
      case Op::FreeWeights: free_weights(in); break;
    }
  }

  IterationResult run(const IterationInput& input) {
    DYNAPIPE_CHECK(input.replica && input.program, "run() needs a replica plan and a program");
    validate_program(*input.program, *input.replica, input.iteration, config, local);
    reset();
    replica = input.replica;
    loss_scale = input.loss_scale;
    optimizer->zero_grad();
    auto begin = Clock::now();
    const auto& instructions = input.program->instructions;
    for (std::size_t k = 0; k < instructions.size(); ++k) {
      const auto& in = instructions[k];
      auto context = [&] {
        return cat("rank ", config.rank, ", iteration ", input.iteration, ", instruction ", k,
                   " (", describe(in), "): ");
      };
      auto t0 = Clock::now();
      try {
        execute(in);
      } catch (const Error& e) {
        pending.clear();
        throw Error(e.kind(), context() + e.what());
      } catch (const c10::Error& e) {
        pending.clear();
        throw Error(ErrorKind::Internal, context() + e.what_without_backtrace());
      } catch (const std::exception& e) {
        pending.clear();
        throw Error(ErrorKind::Internal, context() + e.what());
      }
      auto op = static_cast<std::size_t>(in.op);
      result.op_ms[op] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      result.op_count[op] += 1;
      result.peak_held_bytes = std::max(result.peak_held_bytes, held_bytes());
      if (config.host_cache_limit_bytes > 0 &&
          host_allocator_resident_bytes() > config.host_cache_limit_bytes) {
        release_host_allocator_cache();
      }
    }
    // A plan should finish what it starts; wait for stragglers rather than drop them.
    for (auto& p : pending) {
      try {
        p.work->wait(config.comm_timeout);
      } catch (const Error& e) {
        throw Error(e.kind(), cat("rank ", config.rank, ", iteration ", input.iteration,
                                  ", unfinished ", op_name(p.op), " mb ", p.mb, ": ", e.what()));
      }
    }
    pending.clear();
    result.wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    auto out = result;
    // Drop this iteration's tensors (they pin autograd graphs).
    batches.clear();
    forwarded.clear();
    deferred.clear();
    act_in.clear();
    grad_in.clear();
    act_out.clear();
    grad_out.clear();
    buffers.clear();
    stashed.clear();
    return out;
  }
};

Executor::Executor(ExecutorConfig config, std::map<int, std::shared_ptr<StageModel>> stages,
                   Communicator& pipe, Communicator* dp, CollateFn collate)
    : impl_(std::make_unique<Impl>(config, std::move(stages), pipe, dp, std::move(collate))) {
  DYNAPIPE_CHECK(!impl_->stages.empty(), "an executor needs at least one stage");
}
Executor::~Executor() = default;

IterationResult Executor::run(const IterationInput& input) { return impl_->run(input); }
torch::optim::Optimizer& Executor::optimizer() { return *impl_->optimizer; }
const std::map<int, std::shared_ptr<StageModel>>& Executor::stages() const { return impl_->stages; }
std::vector<torch::Tensor> Executor::parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& [stage, model] : impl_->stages)
    for (auto& p : model->parameters()) params.push_back(p);
  return params;
}

}  // namespace dynapipe::runtime
