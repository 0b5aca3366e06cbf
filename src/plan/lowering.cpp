// Lowering of one replica's schedule to per-executor instruction lists.
//
// Three passes. (1) Index every op of the order: its device, its position there and its
// simulated start/end. (2) Walk each device's ops and decide what every compute op reads
// and writes, as logical buffers: loaded inputs, same-device links, and one Crossing per
// tensor that changes device. (3) Place each crossing's four instructions into gaps
// between compute ops (rules in lowering.h), then flatten the gaps and renumber logical
// buffers 0, 1, 2, ... in order of first write.
//
// Invariants: a gap i holds, in this order, the receives posted before compute op i,
// the send waits (each followed by its FreeBuffer), LoadInput, the receive waits of op i;
// after op i come its SendXStart and the frees of its inputs (each input of a compute op
// has that op as its only reader). Per ordered device pair, receive posts keep the
// sender's posting order.
// Complexity: O(ops + crossings · log ops).
#include "dynapipe/plan/lowering.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "dynapipe/core/error.h"
#include "dynapipe/core/rank_layout.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

[[noreturn]] void bad_input(const std::string& message) {
  throw Error(ErrorKind::InvalidArgument, cat("lowering: ", message));
}

struct OpSlot {
  int device = -1;
  int index = -1;  // position in the device's order
  double start_ms = 0, end_ms = 0;
  bool scheduled = false;
  bool timed = false;
};

// One tensor that changes device: an activation (F -> next stage's F) or a gradient
// (B/I -> previous stage's B/I).
struct Crossing {
  bool is_grad = false;
  int mb = 0;
  int from_stage = 0, to_stage = 0;
  int from_device = 0, to_device = 0;
  int producer_index = 0, consumer_index = 0;  // positions in the two devices' orders
  double send_ms = 0, arrive_ms = 0;
  std::vector<std::int64_t> shape;
  int send_buffer = -1, recv_buffer = -1;  // logical ids on the two devices
};

struct Gap {
  std::vector<std::tuple<double, int, int, Instruction>> posts;  // (key, from device, producer index)
  std::vector<std::pair<int, Instruction>> send_waits;           // (producer index, Finish)
  std::vector<Instruction> loads;
  std::vector<Instruction> recv_waits;
};

struct DeviceBuild {
  std::vector<Gap> before;                      // [op index], plus the end gap
  std::vector<Instruction> compute;             // [op index]
  std::vector<std::vector<Instruction>> after;  // [op index]
  std::vector<double> start_prefix_max;         // [op index]
  int next_buffer = 0;
  int new_buffer() { return next_buffer++; }
};

Instruction comm(InstructionOp op, const Crossing& x, int peer_rank, int buffer) {
  Instruction in;
  in.op = op;
  in.mb = x.mb;
  in.stage = is_send(op) ? x.from_stage : x.to_stage;
  in.peer = peer_rank;
  in.shape = x.shape;
  in.buffer = buffer;
  return in;
}

Instruction free_buffer(int buffer) {
  Instruction in;
  in.op = InstructionOp::FreeBuffer;
  in.buffer = buffer;
  return in;
}

// First op index >= `from` whose start (as a running max, so that a slightly unsorted
// timeline still gives a monotone answer) is at or after `time_ms`; size() if none.
int first_start_at_or_after(const DeviceBuild& build, double time_ms, int from) {
  const auto& starts = build.start_prefix_max;
  auto it = std::lower_bound(starts.begin() + std::min<std::ptrdiff_t>(from, starts.size()),
                             starts.end(), time_ms);
  return static_cast<int>(it - starts.begin());
}

void validate(const LoweringInput& in) {
  if (in.hidden <= 0) bad_input(cat("hidden must be > 0, got ", in.hidden));
  if (in.layout.num_devices < 1 || in.layout.chunks < 1) {
    bad_input(cat("layout must have num_devices >= 1 and chunks >= 1, got ", in.layout.num_devices,
                  " and ", in.layout.chunks));
  }
  if (in.microbatches.empty()) bad_input("microbatches must be non-empty, got none");
  for (std::size_t mb = 0; mb < in.microbatches.size(); ++mb) {
    const MicroBatchShape& s = in.microbatches[mb];
    bool t5 = in.model == ModelKind::T5;
    if (s.batch < 1 || s.seqlen < 1 || (t5 && s.dec_seqlen < 1)) {
      bad_input(cat("microbatches[", mb, "] must have batch, seqlen", t5 ? " and dec_seqlen" : "",
                    " >= 1, got {", s.batch, ", ", s.seqlen, ", ", s.dec_seqlen, "}"));
    }
  }
  if (static_cast<int>(in.stages.size()) != in.layout.num_stages()) {
    bad_input(cat("stages must have one entry per virtual stage (", in.layout.num_stages(),
                  "), got ", in.stages.size()));
  }
  if (in.dp < 1 || in.replica < 0 || in.replica >= in.dp) {
    bad_input(cat("replica must be in [0, dp) with dp >= 1, got replica ", in.replica, ", dp ", in.dp));
  }
  if (in.order == nullptr || in.sim == nullptr) bad_input("order and sim must be set, got null");
  if (static_cast<int>(in.order->device_ops.size()) != in.layout.num_devices) {
    bad_input(cat("order must have one op list per device (", in.layout.num_devices, "), got ",
                  in.order->device_ops.size()));
  }
}

}  // namespace

bool stage_loads_input(const StageLayers& stage) {
  return stage.has_embedding || stage.has_dec_embedding || stage.has_head;
}

std::vector<std::int64_t> boundary_shape(ModelKind model, const StageLayers& sender,
                                         const MicroBatchShape& shape, std::int64_t hidden) {
  if (model == ModelKind::Gpt) return {shape.batch, shape.seqlen, hidden};
  if (sender.has_decoder()) return {shape.batch, shape.seqlen + shape.dec_seqlen, hidden};
  return {shape.batch, shape.seqlen, hidden};
}

namespace {

// One lowering: the passes below, in order, over shared indexes of the order.
class Lowering {
 public:
  explicit Lowering(const LoweringInput& in)
      : in_(in),
        num_devices_(in.layout.num_devices),
        num_stages_(in.layout.num_stages()),
        num_mbs_(static_cast<int>(in.microbatches.size())),
        ranks_{.pp = num_devices_, .dp = in.dp},
        slots_(static_cast<std::size_t>(num_mbs_) * num_stages_ * 4),
        arrival_(static_cast<std::size_t>(num_mbs_) * num_stages_ * 2,
                 std::numeric_limits<double>::quiet_NaN()),
        fwd_out_(static_cast<std::size_t>(num_mbs_) * num_stages_, -1),
        bwd_out_(static_cast<std::size_t>(num_mbs_) * num_stages_, -1),
        builds_(num_devices_) {}

  std::vector<ExecutorProgram> run() {
    index_ops();
    time_ops();
    check_every_op_runs();
    read_arrivals();
    build_compute();
    place_crossings();
    return flatten();
  }

 private:
  std::size_t slot_index(int mb, int stage, OpKind kind) const {
    return (static_cast<std::size_t>(mb) * num_stages_ + stage) * 4 + static_cast<std::size_t>(kind);
  }
  OpSlot& slot(int mb, int stage, OpKind kind) { return slots_[slot_index(mb, stage, kind)]; }
  std::size_t at(int mb, int stage) const { return static_cast<std::size_t>(mb) * num_stages_ + stage; }
  int rank_of(int device) const { return ranks_.rank_of(in_.replica, device); }
  const OpSlot& backward_slot(int mb, int stage) {
    const OpSlot& b = slot(mb, stage, OpKind::B);
    return b.scheduled ? b : slot(mb, stage, OpKind::I);
  }

  // Pass 1a: where every op of the order runs (device, position), each exactly once.
  void index_ops() {
    for (int d = 0; d < num_devices_; ++d) {
      const auto& ops = in_.order->device_ops[d];
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const PipelineOp& op = ops[i];
        if (op.mb < 0 || op.mb >= num_mbs_ || op.stage < 0 || op.stage >= num_stages_) {
          bad_input(cat("order.device_ops[", d, "][", i, "] ", op_name(op), " must have mb in [0, ",
                        num_mbs_, ") and stage in [0, ", num_stages_, ")"));
        }
        if (in_.layout.device_of(op.stage) != d) {
          bad_input(cat("order.device_ops[", d, "][", i, "] ", op_name(op), " must run on device ",
                        in_.layout.device_of(op.stage), ", got device ", d));
        }
        OpSlot& s = slot(op.mb, op.stage, op.kind);
        if (s.scheduled) bad_input(cat("order runs ", op_name(op), " twice"));
        s.scheduled = true;
        s.device = d;
        s.index = i;
      }
    }
  }

  // Pass 1b: when every op runs, from the simulated timeline.
  void time_ops() {
    for (const TimedOp& t : in_.sim->timeline) {
      const PipelineOp& op = t.op;
      if (op.mb < 0 || op.mb >= num_mbs_ || op.stage < 0 || op.stage >= num_stages_) {
        bad_input(cat("sim.timeline op ", op_name(op), " is out of range"));
      }
      OpSlot& s = slot(op.mb, op.stage, op.kind);
      if (!s.scheduled) bad_input(cat("sim.timeline has ", op_name(op), ", which the order does not run"));
      s.timed = true;
      s.start_ms = t.start_ms;
      s.end_ms = t.end_ms;
    }
  }

  // Pass 1c: every (mb, stage) runs F, then B or I-then-W, and every op is timed.
  void check_every_op_runs() {
    for (int mb = 0; mb < num_mbs_; ++mb) {
      for (int s = 0; s < num_stages_; ++s) {
        const OpSlot& f = slot(mb, s, OpKind::F);
        const OpSlot& b = slot(mb, s, OpKind::B);
        const OpSlot& i = slot(mb, s, OpKind::I);
        const OpSlot& w = slot(mb, s, OpKind::W);
        PipelineOp fop{mb, s, OpKind::F};
        if (!f.scheduled) bad_input(cat("order must run ", op_name(fop), ", got none"));
        if (b.scheduled == (i.scheduled || w.scheduled) || i.scheduled != w.scheduled) {
          bad_input(cat("order must run either B or both I and W for (mb ", mb, ", stage ", s, ")"));
        }
        const OpSlot& back = b.scheduled ? b : i;
        if (back.index < f.index || (w.scheduled && w.index < i.index)) {
          bad_input(cat("order must run (mb ", mb, ", stage ", s, ") as F, then B (or I, then W)"));
        }
        for (OpKind kind : {OpKind::F, OpKind::B, OpKind::I, OpKind::W}) {
          const OpSlot& k = slot(mb, s, kind);
          if (k.scheduled && !k.timed) {
            bad_input(cat("sim.timeline must time every op of the order, ", op_name({mb, s, kind}),
                          " is missing"));
          }
        }
      }
    }
  }

  // Arrival times of the simulated transfers, by (mb, from_stage, direction).
  void read_arrivals() {
    for (const Transfer& t : in_.sim->transfers) {
      if (t.mb < 0 || t.mb >= num_mbs_ || t.from_stage < 0 || t.from_stage >= num_stages_) continue;
      arrival_[at(t.mb, t.from_stage) * 2 + (t.is_grad ? 1 : 0)] = t.arrive_ms;
    }
  }

  void add_crossing(bool is_grad, int mb, int from_stage, int to_stage, int consumer_device,
                    int consumer_index, int recv_buffer) {
    Crossing x;
    x.is_grad = is_grad;
    x.mb = mb;
    x.from_stage = from_stage;
    x.to_stage = to_stage;
    const OpSlot& producer = is_grad ? backward_slot(mb, from_stage) : slot(mb, from_stage, OpKind::F);
    x.from_device = producer.device;
    x.to_device = consumer_device;
    x.producer_index = producer.index;
    x.consumer_index = consumer_index;
    x.send_ms = producer.end_ms;
    double arrive = arrival_[at(mb, from_stage) * 2 + (is_grad ? 1 : 0)];
    x.arrive_ms = arrive == arrive ? std::max(arrive, x.send_ms) : x.send_ms;  // NaN: no transfer given
    int boundary = is_grad ? to_stage : from_stage;  // the stage before the boundary
    x.shape = boundary_shape(in_.model, in_.stages[boundary], in_.microbatches[mb], in_.hidden);
    x.send_buffer = is_grad ? bwd_out_[at(mb, from_stage)] : fwd_out_[at(mb, from_stage)];
    x.recv_buffer = recv_buffer;
    crossings_.push_back(std::move(x));
  }

  // Pass 2: compute instructions, logical buffers, crossings.
  void build_compute() {
    for (int d = 0; d < num_devices_; ++d) {
      DeviceBuild& build = builds_[d];
      const auto& ops = in_.order->device_ops[d];
      build.before.resize(ops.size() + 1);
      build.compute.resize(ops.size());
      build.after.resize(ops.size());
      double running = -std::numeric_limits<double>::infinity();
      for (const PipelineOp& op : ops) {
        running = std::max(running, slot(op.mb, op.stage, op.kind).start_ms);
        build.start_prefix_max.push_back(running);
      }
    }
    // Outputs first, so that consumers on any device can refer to them.
    for (int mb = 0; mb < num_mbs_; ++mb) {
      for (int s = 0; s < num_stages_; ++s) {
        DeviceBuild& build = builds_[in_.layout.device_of(s)];
        if (s + 1 < num_stages_) fwd_out_[at(mb, s)] = build.new_buffer();
        if (s > 0) bwd_out_[at(mb, s)] = build.new_buffer();
      }
    }
    for (int d = 0; d < num_devices_; ++d) {
      const auto& ops = in_.order->device_ops[d];
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) builds_[d].compute[i] = compute_of(d, i, ops[i]);
    }
  }

  // The compute instruction of op `i` on device `d`, with what it reads (loads, local
  // links, crossings) and frees after it.
  Instruction compute_of(int d, int i, const PipelineOp& op) {
    DeviceBuild& build = builds_[d];
    const int mb = op.mb, s = op.stage;
    Instruction compute;
    compute.mb = mb;
    compute.stage = s;
    auto consume = [&](int buffer) {
      compute.inputs.push_back(buffer);
      build.after[i].push_back(free_buffer(buffer));
    };
    if (op.kind == OpKind::F) {
      compute.op = InstructionOp::Forward;
      if (s > 0) {
        int prev_device = in_.layout.device_of(s - 1);
        if (prev_device == d) {
          if (slot(mb, s - 1, OpKind::F).index > i) {
            bad_input(cat("order.device_ops[", d, "] runs ", op_name(op), " before ",
                          op_name({mb, s - 1, OpKind::F}), " on the same device"));
          }
          consume(fwd_out_[at(mb, s - 1)]);
        } else {
          int recv = build.new_buffer();
          add_crossing(false, mb, s - 1, s, d, i, recv);
          consume(recv);
        }
      }
      if (stage_loads_input(in_.stages[s])) {
        Instruction load;
        load.op = InstructionOp::LoadInput;
        load.mb = mb;
        load.stage = s;
        load.buffer = build.new_buffer();
        build.before[i].loads.push_back(load);
        consume(load.buffer);
      }
      if (s + 1 < num_stages_) {
        compute.buffer = fwd_out_[at(mb, s)];
        compute.shape = boundary_shape(in_.model, in_.stages[s], in_.microbatches[mb], in_.hidden);
      }
    } else if (op.kind == OpKind::B || op.kind == OpKind::I) {
      compute.op = op.kind == OpKind::B ? InstructionOp::Backward : InstructionOp::BackwardInput;
      if (s + 1 < num_stages_) {
        int next_device = in_.layout.device_of(s + 1);
        if (next_device == d) {
          if (backward_slot(mb, s + 1).index > i) {
            bad_input(cat("order.device_ops[", d, "] runs ", op_name(op),
                          " before the backward of (mb ", mb, ", stage ", s + 1, ") on the same device"));
          }
          consume(bwd_out_[at(mb, s + 1)]);
        } else {
          int recv = build.new_buffer();
          add_crossing(true, mb, s + 1, s, d, i, recv);
          consume(recv);
        }
      }
      if (s > 0) {
        compute.buffer = bwd_out_[at(mb, s)];
        compute.shape = boundary_shape(in_.model, in_.stages[s - 1], in_.microbatches[mb], in_.hidden);
      }
    } else {
      compute.op = InstructionOp::BackwardWeight;
    }
    return compute;
  }

  // Pass 3: place the crossings. Per ordered device pair, in the sender's posting order.
  void place_crossings() {
    std::sort(crossings_.begin(), crossings_.end(), [](const Crossing& a, const Crossing& b) {
      return std::tie(a.from_device, a.to_device, a.producer_index) <
             std::tie(b.from_device, b.to_device, b.producer_index);
    });
    int pair_from = -1, pair_to = -1, pair_position = 0;
    double pair_key = 0;
    for (const Crossing& x : crossings_) {
      DeviceBuild& sender = builds_[x.from_device];
      DeviceBuild& receiver = builds_[x.to_device];
      if (x.from_device != pair_from || x.to_device != pair_to) {
        pair_from = x.from_device;
        pair_to = x.to_device;
        pair_position = 0;
        pair_key = -std::numeric_limits<double>::infinity();
      }
      // Receive: posted before the receiver's first op starting at/after the send.
      int position = std::min(first_start_at_or_after(receiver, x.send_ms, 0), x.consumer_index);
      position = std::max(position, pair_position);
      if (position > x.consumer_index) {
        bad_input(cat("sim.timeline disagrees with the order: the ", x.is_grad ? "gradient" : "activation",
                      " of (mb ", x.mb, ", stage ", x.from_stage, ") is sent after an earlier message of the "
                      "same device pair is consumed"));
      }
      pair_position = position;
      pair_key = std::max(pair_key, x.send_ms);
      const int sender_rank = rank_of(x.from_device), receiver_rank = rank_of(x.to_device);
      auto op_of = [&](InstructionOp act, InstructionOp grad) { return x.is_grad ? grad : act; };
      receiver.before[position].posts.emplace_back(
          pair_key, x.from_device, x.producer_index,
          comm(op_of(InstructionOp::RecvActivationStart, InstructionOp::RecvGradStart), x, sender_rank,
               x.recv_buffer));
      receiver.before[x.consumer_index].recv_waits.push_back(
          comm(op_of(InstructionOp::RecvActivationFinish, InstructionOp::RecvGradFinish), x, sender_rank,
               x.recv_buffer));
      // Send: posted right after the producer; waited on before the backward of the same
      // (mb, stage) (activations) or the first op starting at/after arrival (gradients).
      sender.after[x.producer_index].insert(
          sender.after[x.producer_index].begin(),
          comm(op_of(InstructionOp::SendActivationStart, InstructionOp::SendGradStart), x, receiver_rank,
               x.send_buffer));
      int wait_at = x.is_grad ? first_start_at_or_after(sender, x.arrive_ms, x.producer_index + 1)
                              : backward_slot(x.mb, x.from_stage).index;
      sender.before[wait_at].send_waits.emplace_back(
          x.producer_index,
          comm(op_of(InstructionOp::SendActivationFinish, InstructionOp::SendGradFinish), x, receiver_rank,
               x.send_buffer));
    }
  }

  // Pass 4: flatten each device's gaps and compute ops, renumbering logical buffers in
  // order of first appearance; then the step.
  std::vector<ExecutorProgram> flatten() {
    std::vector<ExecutorProgram> programs(num_devices_);
    for (int d = 0; d < num_devices_; ++d) programs[d] = flatten_device(d);
    return programs;
  }

  ExecutorProgram flatten_device(int d) {
    DeviceBuild& build = builds_[d];
    ExecutorProgram program;
    program.rank = rank_of(d);
    program.device = d;
    program.replica = in_.replica;
    const int n = static_cast<int>(build.compute.size());
    std::size_t total = static_cast<std::size_t>(n) + 2;
    for (int i = 0; i <= n; ++i) {
      const Gap& gap = build.before[i];
      total += gap.posts.size() + 2 * gap.send_waits.size() + gap.loads.size() + gap.recv_waits.size();
      if (i < n) total += build.after[i].size();
    }
    program.instructions.reserve(total);
    std::vector<int> physical(build.next_buffer, -1);
    int next_id = 0;
    auto emit = [&](Instruction instruction) {
      auto map = [&](int& id) {
        if (id < 0) return;
        if (physical[id] < 0) physical[id] = next_id++;
        id = physical[id];
      };
      map(instruction.buffer);
      for (int& input : instruction.inputs) map(input);
      program.instructions.push_back(std::move(instruction));
    };
    for (int i = 0; i <= n; ++i) {
      Gap& gap = build.before[i];
      std::sort(gap.posts.begin(), gap.posts.end(), [](const auto& a, const auto& b) {
        return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
               std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
      });
      for (auto& post : gap.posts) emit(std::move(std::get<3>(post)));
      std::stable_sort(gap.send_waits.begin(), gap.send_waits.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto& [producer, wait] : gap.send_waits) {
        int buffer = wait.buffer;
        emit(std::move(wait));
        emit(free_buffer(buffer));
      }
      for (auto& load : gap.loads) emit(std::move(load));
      for (auto& wait : gap.recv_waits) emit(std::move(wait));
      if (i == n) break;
      emit(std::move(build.compute[i]));
      for (auto& after : build.after[i]) emit(std::move(after));
    }
    Instruction step;
    if (in_.dp > 1) {
      step.op = InstructionOp::ReduceGrads;
      emit(step);
    }
    step.op = InstructionOp::OptimizerStep;
    emit(step);
    return program;
  }

  const LoweringInput& in_;
  const int num_devices_, num_stages_, num_mbs_;
  const RankLayout ranks_;
  std::vector<OpSlot> slots_;       // [mb][stage][kind]
  std::vector<double> arrival_;     // [mb][from stage][direction]; NaN = no transfer given
  std::vector<int> fwd_out_, bwd_out_;  // [mb][stage]: logical output buffers
  std::vector<DeviceBuild> builds_;     // [device]
  std::vector<Crossing> crossings_;
};

}  // namespace

std::vector<ExecutorProgram> lower_to_programs(const LoweringInput& in) {
  validate(in);
  return Lowering(in).run();
}

}  // namespace dynapipe
