// The plan verifier: a worklist replay of every executor's instruction list.
//
// Each executor runs until it reaches a Finish whose peer has not posted the matching
// operation (or a ReduceGrads not everyone in its group has reached); it then parks,
// and is woken when the peer it waits for posts something. Messages between an ordered
// pair (sender, receiver) are matched by posting index: the k-th send with the k-th
// receive. If the worklist empties with executors still parked, the plan deadlocks.
//
// Invariants: a buffer id is written once (LoadInput, Recv*Start, or a compute output),
// is read only while Ready (receives become Ready at their Finish), has at most one
// pending operation, and is freed once with nothing pending. Compute never waits.
// Complexity: O(instructions + wake-ups), wake-ups <= posted Starts + executors; hash
// map lookups per buffer.
#include "dynapipe/plan/verifier.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

enum class Origin : std::uint8_t { Input, Activation, Grad };

struct BufferState {
  enum class Phase : std::uint8_t { Pending, Ready, Freed } phase = Phase::Ready;
  Origin origin = Origin::Input;
  int mb = -1;
  int stage = -1;               // the stage this tensor is an input (or gradient) for
  bool sending = false;         // a Send*Start on it has not been finished
  std::int64_t message = -1;    // posting index of its pending operation within its pair
  int writer = -1;              // instruction index that wrote it; -1: not written
  std::int64_t bytes = 0;
};

// One posted Start, kept per ordered pair (sender, receiver) in posting order.
struct Post {
  int executor = 0;  // program index that posted it
  int index = 0;     // instruction index there
};

struct Pair {
  std::vector<Post> sends, receives;
};

struct Executor {
  const ExecutorProgram* program = nullptr;
  std::size_t pc = 0;
  bool parked = false;
  bool reduced = false;  // arrived at its ReduceGrads
  // [buffer id]; ids are < the program's instruction count (each buffer is written by
  // one instruction), so a vector indexed by id holds them. writer < 0: never written.
  std::vector<BufferState> buffers;
  std::vector<std::uint8_t> done;  // [mb * stages + stage]: bit 0 F, 1 B, 2 I, 3 W
  // Asynchronous schedules (any instruction with a weight version): the current version,
  // the stashed ones, and the version each forward used.
  bool versioned = false;
  int version = 0;
  std::set<int> stashed;
  std::vector<int> fwd_version;  // [mb * stages + stage]
  std::int64_t memory_bytes = 0, peak_bytes = 0;
  // What it waits for when parked: the peer (program index) to post `wait_post`, message
  // #wait_message of the pair; or, with wait_peer -1, the ReduceGrads barrier. Worded only
  // for a deadlock report (wait_text()): a string per park was ~1% of a plan's instructions.
  int wait_peer = -1;
  const char* wait_post = "";
  std::size_t wait_message = 0;
};

constexpr std::uint8_t kF = 1, kB = 2, kI = 4, kW = 8;

// The key of the (sender rank, receiver rank) pair in Replay::pairs_.
std::int64_t pair_key(int sender_rank, int receiver_rank) {
  return (static_cast<std::int64_t>(sender_rank) << 32) +
         static_cast<std::uint32_t>(receiver_rank);
}

class Replay {
 public:
  Replay(const std::vector<ExecutorProgram>& programs, const VerifyOptions& options)
      : programs_(programs), options_(options) {}

  VerifyReport run();

 private:
  [[noreturn]] void fail(const std::string& summary, const std::string& details = "") const {
    std::string message = "plan verification failed: " + summary;
    if (!details.empty()) message += "\n" + details;
    throw Error(options_.error_kind, message);
  }
  std::string where(int e, std::size_t index) const {
    const auto& instructions = executors_[e].program->instructions;
    std::string text = cat("rank ", executors_[e].program->rank, " #", index);
    if (index < instructions.size()) text += " " + to_string(instructions[index]);
    return text;
  }
  [[noreturn]] void fail_at(int e, const std::string& what) const {
    fail(cat(where(e, executors_[e].pc), ": ", what));
  }

  void setup();
  void run_executor(int e);
  // Executes executors_[e]'s current instruction; false if it must wait.
  bool step(int e);
  bool step_compute(int e, const Instruction& in);
  bool step_comm_start(int e, const Instruction& in);
  bool step_comm_finish(int e, const Instruction& in);
  bool step_free_buffer(int e, const Instruction& in);
  bool step_stash_weights(int e, const Instruction& in);
  bool step_free_weights(int e, const Instruction& in);
  bool step_reduce_or_update(int e, const Instruction& in);
  void check_fields(int e, const Instruction& in);
  std::int64_t shape_bytes(int e, const std::vector<std::int64_t>& shape) const;
  BufferState& buffer(int e, int id, const char* role);
  void write_buffer(int e, int id, BufferState state);
  void check_match(int sender, int receiver, std::size_t k);
  void wake(int e);
  void account(int e, std::int64_t delta);
  int replicas_of(const Executor& x) const {
    return options_.stage_replicas.empty() ? 1 : options_.stage_replicas[x.program->device];
  }
  // Whether executor x runs micro-batch mb: stage-replica mb mod r of its device does.
  bool runs_mb(const Executor& x, int mb) const {
    return mb % replicas_of(x) == x.program->stage_replica;
  }
  std::size_t done_index(int mb, int stage) const {
    return static_cast<std::size_t>(mb) * options_.layout.num_stages() + stage;
  }
  [[noreturn]] void report_deadlock() const;
  // What parked executor x waits for, e.g. "to post RecvGradStart (message #3 of the pair)".
  std::string wait_text(const Executor& x) const {
    if (x.wait_peer >= 0) return cat("to post ", x.wait_post, " (message #", x.wait_message, " of the pair)");
    const int device = x.program->device;
    return cat("for all ", group_size_[device], " replicas of device ", device, " to reach ReduceGrads (",
               group_arrived_[device], " have)");
  }
  std::int64_t weight_bytes(int device) const {
    return options_.weight_bytes.empty() ? 0 : options_.weight_bytes[device];
  }

  const std::vector<ExecutorProgram>& programs_;
  const VerifyOptions& options_;
  std::vector<Executor> executors_;
  std::unordered_map<int, int> by_rank_;                  // rank -> program index
  std::unordered_map<std::int64_t, Pair> pairs_;          // sender rank * 2^32 + receiver rank
  std::vector<int> group_size_, group_arrived_;           // [device] ReduceGrads barrier
  std::deque<int> worklist_;
  VerifyReport report_;
};

void Replay::setup() {
  const PipelineLayout& layout = options_.layout;
  if (layout.num_devices < 1 || layout.chunks < 1) {
    fail(cat("options.layout must have num_devices >= 1 and chunks >= 1, got ", layout.num_devices,
             " and ", layout.chunks));
  }
  if (!options_.stage_replicas.empty() &&
      (static_cast<int>(options_.stage_replicas.size()) != layout.num_devices ||
       *std::min_element(options_.stage_replicas.begin(), options_.stage_replicas.end()) < 1)) {
    fail(cat("options.stage_replicas must be empty or one count >= 1 per device (",
             layout.num_devices, "), got ", join(options_.stage_replicas, ",")));
  }
  if (options_.num_microbatches < 1) {
    fail(cat("options.num_microbatches must be >= 1, got ", options_.num_microbatches));
  }
  if (options_.bytes_per_element < 1) {
    fail(cat("options.bytes_per_element must be >= 1, got ", options_.bytes_per_element));
  }
  if (!options_.stored_bytes.empty()) {
    if (static_cast<int>(options_.stored_bytes.size()) != options_.num_microbatches) {
      fail(cat("options.stored_bytes must have one row per micro-batch (", options_.num_microbatches,
               "), got ", options_.stored_bytes.size()));
    }
    for (const auto& row : options_.stored_bytes) {
      if (static_cast<int>(row.size()) != layout.num_stages()) {
        fail(cat("options.stored_bytes rows must have one entry per stage (", layout.num_stages(),
                 "), got ", row.size()));
      }
    }
  }
  if (!options_.weight_bytes.empty() &&
      static_cast<int>(options_.weight_bytes.size()) != layout.num_devices) {
    fail(cat("options.weight_bytes must have one entry per device (", layout.num_devices, "), got ",
             options_.weight_bytes.size()));
  }
  if (programs_.empty()) fail("no executor programs, expected at least one");
  group_size_.assign(layout.num_devices, 0);
  group_arrived_.assign(layout.num_devices, 0);
  executors_.resize(programs_.size());
  for (std::size_t e = 0; e < programs_.size(); ++e) {
    const ExecutorProgram& p = programs_[e];
    const RankLayout ranks{
        .pp = layout.num_devices, .dp = p.replica + 1, .stage_replicas = options_.stage_replicas};
    if (p.device < 0 || p.device >= layout.num_devices || p.replica < 0 || p.stage_replica < 0 ||
        p.stage_replica >= ranks.replicas_of(p.device) ||
        p.rank != ranks.rank_of(p.replica, p.device, p.stage_replica)) {
      fail(cat("executor ", e, " must have device in [0, ", layout.num_devices,
               "), replica >= 0, stage_replica in [0, replicas of its device) and rank = "
               "RankLayout::rank_of(replica, device, stage_replica), got rank ",
               p.rank, ", device ", p.device, ", replica ", p.replica, ", stage_replica ",
               p.stage_replica));
    }
    if (!by_rank_.emplace(p.rank, static_cast<int>(e)).second) {
      fail(cat("rank ", p.rank, " must appear once, got it twice"));
    }
    Executor& x = executors_[e];
    x.program = &p;
    x.done.assign(static_cast<std::size_t>(options_.num_microbatches) * layout.num_stages(), 0);
    x.buffers.resize(p.instructions.size());
    if (!options_.static_bytes.empty() && !options_.stored_bytes.empty()) {
      if (static_cast<int>(options_.static_bytes.size()) != layout.num_devices) {
        fail(cat("options.static_bytes must have one entry per device (", layout.num_devices, "), got ",
                 options_.static_bytes.size()));
      }
      account(static_cast<int>(e), options_.static_bytes[p.device]);
    }
    int reduce_count = 0, step_count = 0;
    for (const Instruction& in : p.instructions) {
      reduce_count += in.op == InstructionOp::ReduceGrads;
      step_count += in.op == InstructionOp::OptimizerStep;
      x.versioned |= in.version >= 0;
    }
    x.fwd_version.assign(x.done.size(), -1);
    if (x.versioned) {
      // Asynchronous: a step per update, no data-parallel reduction (dp 1).
      if (reduce_count > 0) {
        fail(cat("rank ", p.rank, " uses weight versions and must have no ReduceGrads, got ",
                 reduce_count));
      }
      continue;
    }
    if (reduce_count > 1 || step_count != 1 ||
        p.instructions.back().op != InstructionOp::OptimizerStep) {
      fail(cat("rank ", p.rank, " must end with exactly one OptimizerStep and have at most one "
               "ReduceGrads, got ", step_count, " OptimizerStep and ", reduce_count, " ReduceGrads"));
    }
    if (reduce_count == 1) ++group_size_[p.device];
  }
}

void Replay::account(int e, std::int64_t delta) {
  if (options_.stored_bytes.empty()) return;
  Executor& x = executors_[e];
  x.memory_bytes += delta;
  if (x.memory_bytes > x.peak_bytes) {
    x.peak_bytes = x.memory_bytes;
    if (options_.memory_limit_bytes > 0 && x.peak_bytes > options_.memory_limit_bytes) {
      fail_at(e, cat("memory must stay within the limit of ", options_.memory_limit_bytes,
                     " bytes, got ", x.peak_bytes, " bytes"));
    }
  }
}

std::int64_t Replay::shape_bytes(int e, const std::vector<std::int64_t>& shape) const {
  std::int64_t elements = 1;
  for (std::int64_t dim : shape) {
    if (dim < 1) fail_at(e, cat("shape dims must be >= 1, got ", dim));
    if (__builtin_mul_overflow(elements, dim, &elements)) fail_at(e, "shape must fit in int64 elements");
  }
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<std::int64_t>(options_.bytes_per_element), &bytes)) {
    fail_at(e, "shape must fit in int64 bytes");
  }
  return bytes;
}

void Replay::check_fields(int e, const Instruction& in) {
  const Executor& x = executors_[e];
  const int stages = options_.layout.num_stages();
  auto need_mb_stage = [&] {
    if (in.mb < 0 || in.mb >= options_.num_microbatches) {
      fail_at(e, cat("mb must be in [0, ", options_.num_microbatches, "), got ", in.mb));
    }
    if (in.stage < 0 || in.stage >= stages) {
      fail_at(e, cat("stage must be in [0, ", stages, "), got ", in.stage));
    }
    if (!runs_mb(x, in.mb)) {  // round robin over a replicated stage's ranks
      fail_at(
          e, cat("mb ", in.mb, " must run on stage-replica ", in.mb % replicas_of(x), " of device ",
                 x.program->device, ", got stage-replica ", x.program->stage_replica));
    }
  };
  if (is_compute(in.op)) {
    need_mb_stage();
    if (options_.layout.device_of(in.stage) != x.program->device) {
      fail_at(e, cat("stage ", in.stage, " must run on device ", options_.layout.device_of(in.stage),
                     ", got device ", x.program->device));
    }
  } else if (is_communication(in.op)) {
    need_mb_stage();
    auto peer = by_rank_.find(in.peer);
    if (peer == by_rank_.end() || in.peer == x.program->rank) {
      fail_at(e, cat("peer must be the rank of another executor, got ", in.peer));
    }
    if (in.shape.empty()) fail_at(e, "a communication must carry a shape, got none");
    if (in.buffer < 0) fail_at(e, cat("a communication must name a buffer, got ", in.buffer));
    int stage_here = in.stage;
    if (options_.layout.device_of(stage_here) != x.program->device) {
      fail_at(e, cat("stage ", stage_here, " must be on device ", options_.layout.device_of(stage_here),
                     " to communicate from there, got device ", x.program->device));
    }
  } else if (in.op == InstructionOp::FreeBuffer) {
    if (in.buffer < 0) fail_at(e, cat("FreeBuffer must name a buffer, got ", in.buffer));
  }
  const bool uses_weights = in.op == InstructionOp::Forward || in.op == InstructionOp::Backward ||
                            in.op == InstructionOp::StashWeights ||
                            in.op == InstructionOp::FreeWeights;
  if (x.versioned && uses_weights && in.version < 0) {
    fail_at(e, cat(instruction_op_name(in.op),
                   " must name a weight version in a versioned program, got none"));
  }
  const bool split =
      in.op == InstructionOp::BackwardInput || in.op == InstructionOp::BackwardWeight;
  if (x.versioned && split) {
    fail_at(e, "a versioned program must use Backward, not the split backward");
  }
}

BufferState& Replay::buffer(int e, int id, const char* role) {
  auto& buffers = executors_[e].buffers;
  if (id < 0 || static_cast<std::size_t>(id) >= buffers.size() || buffers[id].writer < 0) {
    fail_at(e, cat(role, " buffer ", id, " must have been written before, got never written"));
  }
  if (buffers[id].phase == BufferState::Phase::Freed) {
    fail_at(e, cat(role, " buffer ", id, " is used after its FreeBuffer"));
  }
  return buffers[id];
}

void Replay::write_buffer(int e, int id, BufferState state) {
  if (id < 0) return;
  auto& buffers = executors_[e].buffers;
  if (static_cast<std::size_t>(id) >= buffers.size()) {
    fail_at(e, cat("buffer id must be < the program's instruction count (", buffers.size(), "), got ", id));
  }
  if (buffers[id].writer >= 0) {
    fail_at(e, cat("buffer ", id, " must be written once, got a second write (first by #",
                   buffers[id].writer, ")"));
  }
  state.writer = static_cast<int>(executors_[e].pc);
  buffers[id] = state;
  account(e, state.bytes);
}

void Replay::check_match(int sender, int receiver, std::size_t k) {
  const std::int64_t key = pair_key(programs_[sender].rank, programs_[receiver].rank);
  const Pair& pair = pairs_[key];
  if (k >= pair.sends.size() || k >= pair.receives.size()) return;
  const Post& s = pair.sends[k];
  const Post& r = pair.receives[k];
  const Instruction& send = programs_[s.executor].instructions[s.index];
  const Instruction& recv = programs_[r.executor].instructions[r.index];
  bool grad = is_grad_comm(send.op);
  std::string problem;
  if (grad != is_grad_comm(recv.op)) {
    problem = "kinds differ (activation vs gradient)";
  } else if (send.mb != recv.mb) {
    problem = cat("mbs differ (", send.mb, " vs ", recv.mb, ")");
  } else if (send.shape != recv.shape) {
    problem = cat("shapes differ ([", join(send.shape, ","), "] vs [", join(recv.shape, ","), "])");
  } else if (recv.stage != send.stage + (grad ? -1 : 1)) {
    problem = cat("the receiver's stage must be the sender's ", grad ? "- 1" : "+ 1", ", got ",
                  send.stage, " -> ", recv.stage);
  }
  if (problem.empty()) {
    ++report_.messages;
    return;
  }
  fail(cat("message #", k, " from rank ", programs_[sender].rank, " to rank ", programs_[receiver].rank,
           " does not match: ", problem),
       cat("  ", where(s.executor, s.index), "\n  ", where(r.executor, r.index),
           "\n  sends and receives between two executors are matched in posting order and must "
           "agree on kind, mb, shape and stages"));
}

void Replay::wake(int e) {
  Executor& x = executors_[e];
  if (x.parked) {
    x.parked = false;
    worklist_.push_back(e);
  }
}

bool Replay::step(int e) {
  Executor& x = executors_[e];
  const Instruction& in = x.program->instructions[x.pc];
  check_fields(e, in);
  switch (in.op) {
    case InstructionOp::LoadInput:
      if (in.buffer < 0) fail_at(e, "LoadInput must name the buffer it fills, got none");
      write_buffer(e, in.buffer, {.origin = Origin::Input, .mb = in.mb, .stage = in.stage});
      return true;
    case InstructionOp::Forward:
    case InstructionOp::Backward:
    case InstructionOp::BackwardInput:
    case InstructionOp::BackwardWeight: return step_compute(e, in);
    case InstructionOp::SendActivationStart:
    case InstructionOp::SendGradStart:
    case InstructionOp::RecvActivationStart:
    case InstructionOp::RecvGradStart: return step_comm_start(e, in);
    case InstructionOp::SendActivationFinish:
    case InstructionOp::SendGradFinish:
    case InstructionOp::RecvActivationFinish:
    case InstructionOp::RecvGradFinish: return step_comm_finish(e, in);
    case InstructionOp::FreeBuffer: return step_free_buffer(e, in);
    case InstructionOp::StashWeights: return step_stash_weights(e, in);
    case InstructionOp::FreeWeights: return step_free_weights(e, in);
    case InstructionOp::OptimizerStep:
    case InstructionOp::ReduceGrads: return step_reduce_or_update(e, in);
  }
  fail_at(e, cat("op must be a known instruction op, got ", static_cast<int>(in.op)));
}

// Forward / backward: run once, in order, on complete inputs of the right (mb, stage),
// on a weight version that is still held.
bool Replay::step_compute(int e, const Instruction& in) {
  Executor& x = executors_[e];
  const int stages = options_.layout.num_stages();
  const InstructionOp op = in.op;
  auto stored = [&](int mb, int stage) {
    return options_.stored_bytes.empty() ? 0 : options_.stored_bytes[mb][stage];
  };
  std::uint8_t& done = x.done[done_index(in.mb, in.stage)];
  const bool forward = op == InstructionOp::Forward;
  if (forward && (done & kF)) fail_at(e, "the forward of this (mb, stage) must run once, got twice");
  if (!forward && !(done & kF)) fail_at(e, "a backward must run after its forward, got no forward yet");
  if (op == InstructionOp::Backward && (done & (kB | kI))) fail_at(e, "backward must run once, got twice");
  if (op == InstructionOp::BackwardInput && (done & (kB | kI))) {
    fail_at(e, "BackwardInput must run once and not with Backward, got twice");
  }
  if (op == InstructionOp::BackwardWeight && (!(done & kI) || (done & kW))) {
    fail_at(e, "BackwardWeight must run once, after its BackwardInput");
  }
  if (op == InstructionOp::BackwardWeight && !in.inputs.empty()) {
    fail_at(e, "BackwardWeight must read no buffers");
  }
  // Inputs: complete, for this (mb, stage), of the right kind.
  bool has_main = false;  // stage 0 forward: a loaded input; else the activation / gradient
  for (int id : in.inputs) {
    BufferState& b = buffer(e, id, "input");
    if (b.phase != BufferState::Phase::Ready) {
      fail_at(e, cat("input buffer ", id, " must be complete, got a receive not yet finished"));
    }
    bool fits = b.mb == in.mb && b.stage == in.stage &&
                (forward ? b.origin != Origin::Grad : b.origin == Origin::Grad);
    if (!fits) {
      fail_at(e, cat("input buffer ", id, " must hold ", forward ? "an input or activation" : "a gradient",
                     " for (mb ", in.mb, ", stage ", in.stage, "), got one written by #", b.writer));
    }
    has_main |= forward ? (in.stage == 0 ? b.origin == Origin::Input : b.origin == Origin::Activation)
                        : true;
  }
  bool needs_main = forward || (op != InstructionOp::BackwardWeight && in.stage + 1 < stages);
  if (needs_main && !has_main) {
    fail_at(e, forward ? (in.stage == 0 ? "the first stage's forward must read a LoadInput buffer"
                                        : "a forward must read the activation of the previous stage")
                       : "a backward must read the gradient from the next stage");
  }
  if (in.buffer >= 0) {
    if (op == InstructionOp::BackwardWeight) fail_at(e, "BackwardWeight must write no buffer");
    BufferState out{.origin = forward ? Origin::Activation : Origin::Grad,
                    .mb = in.mb,
                    .stage = in.stage + (forward ? 1 : -1)};
    if (!in.shape.empty()) out.bytes = shape_bytes(e, in.shape);
    write_buffer(e, in.buffer, out);
  }
  if (x.versioned) {
    // The weights it runs on: the current version or a stashed one; a backward runs
    // on the version of its forward (weight stashing).
    if (in.version != x.version && !x.stashed.count(in.version)) {
      fail_at(e, cat("weight version ", in.version, " must be the current one (", x.version,
                     ") or stashed, got neither (freed or never stashed)"));
    }
    int& used = x.fwd_version[done_index(in.mb, in.stage)];
    if (forward) used = in.version;
    if (!forward && used != in.version) {
      fail_at(e, cat("a backward must use its forward's weight version ", used, ", got ",
                     in.version));
    }
  }
  switch (op) {
    case InstructionOp::Forward: done |= kF; account(e, stored(in.mb, in.stage)); break;
    case InstructionOp::Backward: done |= kB; account(e, -stored(in.mb, in.stage)); break;
    case InstructionOp::BackwardInput: done |= kI; break;
    default: done |= kW; account(e, -stored(in.mb, in.stage)); break;
  }
  return true;
}

// A send or receive is posted: matched with the peer's posts in order.
bool Replay::step_comm_start(int e, const Instruction& in) {
  Executor& x = executors_[e];
  const InstructionOp op = in.op;
  const bool grad = is_grad_comm(op);
  const int peer = by_rank_.at(in.peer);
  const bool send = is_send(op);
  const std::int64_t key =
      send ? pair_key(x.program->rank, in.peer) : pair_key(in.peer, x.program->rank);
  Pair& pair = pairs_[key];
  std::vector<Post>& mine = send ? pair.sends : pair.receives;
  const std::size_t k = mine.size();
  if (send) {
    BufferState& b = buffer(e, in.buffer, "sent");
    Origin want = grad ? Origin::Grad : Origin::Activation;
    int want_stage = in.stage + (grad ? -1 : 1);
    if (b.phase != BufferState::Phase::Ready || b.sending || b.origin != want || b.mb != in.mb ||
        b.stage != want_stage) {
      fail_at(e, cat("sent buffer ", in.buffer, " must be a complete, idle ", grad ? "gradient" : "activation",
                     " output of (mb ", in.mb, ", stage ", in.stage, ")"));
    }
    b.sending = true;
    b.message = static_cast<std::int64_t>(k);
  } else {
    write_buffer(e, in.buffer,
                 {.phase = BufferState::Phase::Pending,
                  .origin = grad ? Origin::Grad : Origin::Activation,
                  .mb = in.mb,
                  .stage = in.stage,
                  .message = static_cast<std::int64_t>(k),
                  .bytes = shape_bytes(e, in.shape)});
  }
  mine.push_back({e, static_cast<int>(x.pc)});
  check_match(send ? e : peer, send ? peer : e, k);
  wake(peer);
  return true;
}

// A send or receive completes: false (wait) until the peer has posted its side.
bool Replay::step_comm_finish(int e, const Instruction& in) {
  Executor& x = executors_[e];
  const InstructionOp op = in.op;
  const bool send = is_send(op);
  BufferState& b = buffer(e, in.buffer, send ? "sent" : "received");
  bool pending = send ? b.sending : b.phase == BufferState::Phase::Pending;
  if (!pending) fail_at(e, cat("buffer ", in.buffer, " must have a pending ", send ? "send" : "receive",
                               " to finish, got none"));
  const std::int64_t key =
      send ? pair_key(x.program->rank, in.peer) : pair_key(in.peer, x.program->rank);
  Pair& pair = pairs_[key];
  const std::vector<Post>& mine = send ? pair.sends : pair.receives;
  const std::vector<Post>& theirs = send ? pair.receives : pair.sends;
  const auto k = static_cast<std::size_t>(b.message);
  if (b.message < 0 || k >= mine.size() || mine[k].executor != e) {
    fail_at(e, cat("buffer ", in.buffer, " must have been posted to rank ", in.peer, " by a Start, got "
                   "a Start to another peer"));
  }
  const Instruction& posted = programs_[e].instructions[mine[k].index];
  if (comm_finish_of(posted.op) != op || posted.mb != in.mb || posted.stage != in.stage ||
      posted.peer != in.peer || posted.shape != in.shape) {
    fail_at(e, cat("a Finish must repeat the fields of its Start, got Start #", mine[k].index, " ",
                   to_string(posted)));
  }
  if (theirs.size() <= k) {
    x.wait_peer = by_rank_.at(in.peer);
    x.wait_post = send ? (is_grad_comm(op) ? "RecvGradStart" : "RecvActivationStart")
                       : (is_grad_comm(op) ? "SendGradStart" : "SendActivationStart");
    x.wait_message = k;
    return false;
  }
  if (send) {
    b.sending = false;
  } else {
    b.phase = BufferState::Phase::Ready;
  }
  b.message = -1;
  return true;
}

// A buffer is freed: nothing may still be in flight on it.
bool Replay::step_free_buffer(int e, const Instruction& in) {
  BufferState& b = buffer(e, in.buffer, "freed");
  if (b.phase == BufferState::Phase::Pending || b.sending) {
    fail_at(e, cat("buffer ", in.buffer, " must have no pending operation when freed, got a pending ",
                   b.sending ? "send" : "receive"));
  }
  b.phase = BufferState::Phase::Freed;
  account(e, -b.bytes);
  return true;
}

// The current weight version is copied (asynchronous schedules).
bool Replay::step_stash_weights(int e, const Instruction& in) {
  Executor& x = executors_[e];
  if (in.version != x.version || x.stashed.count(in.version)) {
    fail_at(e, cat("StashWeights must copy the current version ", x.version,
                   " once, got version ", in.version));
  }
  x.stashed.insert(in.version);
  account(e, weight_bytes(x.program->device));
  return true;
}

// A stashed weight version is dropped.
bool Replay::step_free_weights(int e, const Instruction& in) {
  Executor& x = executors_[e];
  if (!x.stashed.erase(in.version)) {
    fail_at(e, cat("FreeWeights must free a stashed version, got version ", in.version));
  }
  account(e, -weight_bytes(x.program->device));
  return true;
}

// ReduceGrads / OptimizerStep: after every F and B of the executor; ReduceGrads waits
// for the device's whole group.
bool Replay::step_reduce_or_update(int e, const Instruction& in) {
  Executor& x = executors_[e];
  const int stages = options_.layout.num_stages();
  const InstructionOp op = in.op;
  if (x.versioned) {
    ++x.version;
    return true;
  }
  for (int mb = 0; mb < options_.num_microbatches; ++mb) {
    if (!runs_mb(x, mb)) continue;
    for (int s = x.program->device; s < stages; s += options_.layout.num_devices) {
      std::uint8_t done = x.done[done_index(mb, s)];
      if (!(done & kF) || !((done & kB) || (done & kW))) {
        fail_at(e, cat(instruction_op_name(op), " must come after every forward and backward of the "
                       "executor, got (mb ", mb, ", stage ", s, ") not ",
                       (done & kF) ? "backpropagated" : "run"));
      }
    }
  }
  if (op == InstructionOp::OptimizerStep) return true;
  if (!x.reduced) {
    x.reduced = true;
    if (++group_arrived_[x.program->device] == group_size_[x.program->device]) {
      for (std::size_t other = 0; other < executors_.size(); ++other) {
        if (programs_[other].device == x.program->device) wake(static_cast<int>(other));
      }
    }
  }
  if (group_arrived_[x.program->device] < group_size_[x.program->device]) {
    x.wait_peer = -1;
    return false;
  }
  return true;
}

void Replay::run_executor(int e) {
  Executor& x = executors_[e];
  const auto& instructions = x.program->instructions;
  while (x.pc < instructions.size()) {
    if (!step(e)) {
      x.parked = true;
      return;
    }
    ++x.pc;
    ++report_.instructions;
  }
}

void Replay::report_deadlock() const {
  std::ostringstream details;
  int blocked = 0, first = -1;
  for (std::size_t e = 0; e < executors_.size(); ++e) {
    const Executor& x = executors_[e];
    if (x.pc >= x.program->instructions.size()) continue;
    if (first < 0) first = static_cast<int>(e);
    ++blocked;
    details << "  rank " << x.program->rank << " waits at #" << x.pc << ' '
            << to_string(x.program->instructions[x.pc]);
    if (x.wait_peer >= 0) {
      const Executor& p = executors_[x.wait_peer];
      details << " for rank " << p.program->rank << ' ' << wait_text(x);
      if (p.pc < p.program->instructions.size()) {
        details << ", which is blocked at #" << p.pc << ' ' << to_string(p.program->instructions[p.pc]);
      } else {
        details << ", which has finished";
      }
    } else {
      details << ' ' << wait_text(x);
    }
    details << '\n';
  }
  // The wait-for cycle through the first blocked executor, if there is one.
  std::vector<int> chain;
  std::vector<int> seen(executors_.size(), -1);
  for (int e = first; e >= 0 && seen[e] < 0; e = executors_[e].wait_peer) {
    seen[e] = static_cast<int>(chain.size());
    chain.push_back(e);
    if (executors_[e].pc >= executors_[e].program->instructions.size()) break;
  }
  std::string summary = cat("deadlock: ", blocked, " of ", executors_.size(), " executors blocked");
  int last = chain.empty() ? -1 : executors_[chain.back()].wait_peer;
  if (last >= 0 && seen[last] >= 0) {
    std::vector<int> cycle;
    for (std::size_t i = seen[last]; i < chain.size(); ++i) cycle.push_back(programs_[chain[i]].rank);
    cycle.push_back(programs_[last].rank);
    summary += cat(" (wait cycle: rank ", join(cycle, " -> rank "), ")");
  }
  std::string text = details.str();
  if (!text.empty()) text.pop_back();
  fail(summary, text);
}

VerifyReport Replay::run() {
  setup();
  for (std::size_t e = 0; e < executors_.size(); ++e) worklist_.push_back(static_cast<int>(e));
  while (!worklist_.empty()) {
    int e = worklist_.front();
    worklist_.pop_front();
    run_executor(e);
  }
  for (const Executor& x : executors_) {
    if (x.pc < x.program->instructions.size()) report_deadlock();
  }
  // Everything ran, everything was freed.
  for (std::size_t e = 0; e < executors_.size(); ++e) {
    const Executor& x = executors_[e];
    std::vector<int> leaked;
    for (std::size_t id = 0; id < x.buffers.size(); ++id) {
      if (x.buffers[id].writer >= 0 && x.buffers[id].phase != BufferState::Phase::Freed) {
        leaked.push_back(static_cast<int>(id));
      }
    }
    if (!leaked.empty()) {
      fail(cat("rank ", x.program->rank, " must free every buffer by the end, got buffers [",
               join(leaked, ","), "] still live"));
    }
    // A versioned program has no final step that checks this: every (mb, stage) ran.
    for (int mb = 0; x.versioned && mb < options_.num_microbatches; ++mb) {
      const int step = options_.layout.num_devices;
      for (int s = x.program->device; s < options_.layout.num_stages(); s += step) {
        const std::uint8_t done = x.done[done_index(mb, s)];
        if (!(done & kF) || !(done & kB)) {
          fail(cat("rank ", x.program->rank,
                   " must run the forward and backward of every micro-batch, got (mb ", mb,
                   ", stage ", s, ") not ", (done & kF) ? "backpropagated" : "run"));
        }
      }
    }
    if (!x.stashed.empty()) {
      fail(cat("rank ", x.program->rank,
               " must free every stashed weight version by the end, got [", join(x.stashed, ","),
               "] still stashed"));
    }
    if (!options_.stored_bytes.empty()) report_.peak_memory_bytes.push_back(x.peak_bytes);
  }
  return report_;
}

}  // namespace

VerifyReport verify_programs(const std::vector<ExecutorProgram>& programs, const VerifyOptions& options) {
  return Replay(programs, options).run();
}

}  // namespace dynapipe
