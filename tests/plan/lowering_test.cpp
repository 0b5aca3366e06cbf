#include "dynapipe/plan/lowering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dynapipe/core/error.h"
#include "dynapipe/plan/verifier.h"
#include "dynapipe/core/rng.h"
#include "dynapipe/schedule/schedule.h"
#include "plan/test_pipelines.h"
#include "schedule/schedule_test_util.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Op = InstructionOp;
using Shape = std::vector<std::int64_t>;

Instruction make(Op op, int mb = -1, int stage = -1, int peer = -1, Shape shape = {}, int buffer = -1,
                 std::vector<int> inputs = {}) {
  return Instruction{op, mb, stage, peer, std::move(shape), buffer, std::move(inputs)};
}
Instruction free_buffer(int buffer) { return make(Op::FreeBuffer, -1, -1, -1, {}, buffer); }

std::string listing(const ExecutorProgram& program) {
  std::string text;
  for (std::size_t i = 0; i < program.instructions.size(); ++i) {
    text += cat("#", i, " ", to_string(program.instructions[i]), "\n");
  }
  return text;
}

int count_ops(const ExecutorProgram& program, Op op) {
  int n = 0;
  for (const Instruction& in : program.instructions) n += in.op == op;
  return n;
}

VerifyOptions options_for(const testing::Lowered& lowered) {
  VerifyOptions options;
  options.layout = lowered.layout;
  options.num_microbatches = static_cast<int>(lowered.shapes.size());
  return options;
}

// 2 stages x 2 micro-batches, 1F1B, GPT hidden 16, mb0 = [2, 8], mb1 = [1, 16]; F takes
// 1 ms, B 2 ms, messages are free. Simulated: rank 0 runs F0 [0,1] F1 [1,2] B0 [4,6]
// B1 [7,9]; rank 1 runs F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7].
TEST(LoweringTest, OneFOneBTwoStagesTwoMicroBatchesExactly) {
  PipelineLayout layout{.num_devices = 2};
  ScheduleOrder order = testing::one_f_one_b(2, 2);
  SimResult sim = testing::simulate(order, layout, 2);
  LoweringInput in;
  in.hidden = 16;
  in.layout = layout;
  in.microbatches = {{2, 8, 0}, {1, 16, 0}};
  in.stages = testing::gpt_stages(2);
  in.order = &order;
  in.sim = &sim;
  std::vector<ExecutorProgram> programs = lower_to_programs(in);
  ASSERT_EQ(programs.size(), 2u);

  const Shape a0{2, 8, 16}, a1{1, 16, 16};
  std::vector<Instruction> rank0 = {
      make(Op::LoadInput, 0, 0, -1, {}, 0),
      make(Op::Forward, 0, 0, -1, a0, 1, {0}),
      make(Op::SendActivationStart, 0, 0, 1, a0, 1),
      free_buffer(0),
      make(Op::LoadInput, 1, 0, -1, {}, 2),
      make(Op::Forward, 1, 0, -1, a1, 3, {2}),
      make(Op::SendActivationStart, 1, 0, 1, a1, 3),
      free_buffer(2),
      make(Op::RecvGradStart, 0, 0, 1, a0, 4),          // posted when rank 1 sends it (t=4)
      make(Op::SendActivationFinish, 0, 0, 1, a0, 1),   // before the backward of (mb 0, stage 0)
      free_buffer(1),
      make(Op::RecvGradFinish, 0, 0, 1, a0, 4),
      make(Op::Backward, 0, 0, -1, {}, -1, {4}),
      free_buffer(4),
      make(Op::RecvGradStart, 1, 0, 1, a1, 5),
      make(Op::SendActivationFinish, 1, 0, 1, a1, 3),
      free_buffer(3),
      make(Op::RecvGradFinish, 1, 0, 1, a1, 5),
      make(Op::Backward, 1, 0, -1, {}, -1, {5}),
      free_buffer(5),
      make(Op::OptimizerStep),
  };
  std::vector<Instruction> rank1 = {
      make(Op::RecvActivationStart, 0, 1, 0, a0, 0),
      make(Op::LoadInput, 0, 1, -1, {}, 1),             // labels
      make(Op::RecvActivationFinish, 0, 1, 0, a0, 0),
      make(Op::Forward, 0, 1, -1, {}, -1, {0, 1}),
      free_buffer(0),
      free_buffer(1),
      make(Op::RecvActivationStart, 1, 1, 0, a1, 2),    // sent at t=2, before B0 starts
      make(Op::Backward, 0, 1, -1, a0, 3),
      make(Op::SendGradStart, 0, 1, 0, a0, 3),
      make(Op::SendGradFinish, 0, 1, 0, a0, 3),         // arrived at t=4, before F1 starts
      free_buffer(3),
      make(Op::LoadInput, 1, 1, -1, {}, 4),
      make(Op::RecvActivationFinish, 1, 1, 0, a1, 2),
      make(Op::Forward, 1, 1, -1, {}, -1, {2, 4}),
      free_buffer(2),
      free_buffer(4),
      make(Op::Backward, 1, 1, -1, a1, 5),
      make(Op::SendGradStart, 1, 1, 0, a1, 5),
      make(Op::SendGradFinish, 1, 1, 0, a1, 5),         // nothing runs after: end of iteration
      free_buffer(5),
      make(Op::OptimizerStep),
  };
  EXPECT_EQ(programs[0].instructions, rank0) << listing(programs[0]);
  EXPECT_EQ(programs[1].instructions, rank1) << listing(programs[1]);
  EXPECT_EQ(programs[1].rank, 1);
  EXPECT_EQ(programs[1].device, 1);

  VerifyOptions options;
  options.layout = layout;
  options.num_microbatches = 2;
  VerifyReport report = verify_programs(programs, options);
  EXPECT_EQ(report.messages, 4);
}

TEST(LoweringTest, T5ShapesAcrossTheEncoderDecoderBoundary) {
  StageLayers enc0{.enc_begin = 0, .enc_end = 2, .has_embedding = true};
  StageLayers enc1{.enc_begin = 2, .enc_end = 4};
  StageLayers both{.enc_begin = 2, .enc_end = 4, .dec_begin = 0, .dec_end = 1, .has_dec_embedding = true};
  StageLayers dec{.dec_begin = 0, .dec_end = 2, .has_dec_embedding = true};
  MicroBatchShape mb{.batch = 2, .seqlen = 32, .dec_seqlen = 8};
  EXPECT_EQ(boundary_shape(ModelKind::T5, enc0, mb, 16), (Shape{2, 32, 16}));
  EXPECT_EQ(boundary_shape(ModelKind::T5, enc1, mb, 16), (Shape{2, 32, 16}));  // encoder output
  EXPECT_EQ(boundary_shape(ModelKind::T5, both, mb, 16), (Shape{2, 40, 16}));
  EXPECT_EQ(boundary_shape(ModelKind::T5, dec, mb, 16), (Shape{2, 40, 16}));
  EXPECT_EQ(boundary_shape(ModelKind::Gpt, enc0, {2, 32, 0}, 16), (Shape{2, 32, 16}));
  EXPECT_FALSE(stage_loads_input(enc1));
  EXPECT_TRUE(stage_loads_input(dec));

  // 4 stages: encoder on 0-1, decoder on 2-3. Every message of mb m has the shape of the
  // boundary it crosses, in both directions.
  testing::Lowered t5 = testing::lower(testing::one_f_one_b(4, 3), {.num_devices = 4}, 3, ModelKind::T5);
  for (const ExecutorProgram& program : t5.programs) {
    for (const Instruction& in : program.instructions) {
      if (!is_communication(in.op)) continue;
      const MicroBatchShape& s = t5.shapes[in.mb];
      bool grad = is_grad_comm(in.op);
      int boundary = is_send(in.op) == grad ? in.stage - 1 : in.stage;  // stage before the cut
      Shape expected = boundary < 2 ? Shape{s.batch, s.seqlen, 16} : Shape{s.batch, s.seqlen + s.dec_seqlen, 16};
      EXPECT_EQ(in.shape, expected) << "rank " << program.rank << " " << to_string(in);
    }
  }
  // Stage 0 loads tokens, stage 2 decoder tokens, stage 3 labels; stage 1 nothing.
  EXPECT_EQ(count_ops(t5.programs[0], Op::LoadInput), 3);
  EXPECT_EQ(count_ops(t5.programs[1], Op::LoadInput), 0);
  EXPECT_EQ(count_ops(t5.programs[2], Op::LoadInput), 3);
  EXPECT_EQ(count_ops(t5.programs[3], Op::LoadInput), 3);
  verify_programs(t5.programs, options_for(t5));
}

TEST(LoweringTest, SameDeviceBoundariesNeedNoCommunication) {
  // One device, two chunks: stage 1 reads stage 0's output buffer directly.
  testing::Lowered one = testing::lower(testing::looped({.num_devices = 1, .chunks = 2}, 3),
                                        {.num_devices = 1, .chunks = 2}, 3);
  ASSERT_EQ(one.programs.size(), 1u);
  for (const Instruction& in : one.programs[0].instructions) {
    EXPECT_FALSE(is_communication(in.op)) << to_string(in);
  }
  const auto& list = one.programs[0].instructions;
  auto find = [&](Op op, int mb, int stage) {
    return std::find_if(list.begin(), list.end(), [&](const Instruction& in) {
      return in.op == op && in.mb == mb && in.stage == stage;
    });
  };
  // The activation comes first, then the labels the last stage loads.
  EXPECT_EQ(find(Op::Forward, 1, 1)->inputs.at(0), find(Op::Forward, 1, 0)->buffer);
  EXPECT_EQ(find(Op::Forward, 1, 1)->inputs.at(1), find(Op::LoadInput, 1, 1)->buffer);
  EXPECT_EQ(find(Op::Backward, 1, 0)->inputs, std::vector<int>{find(Op::Backward, 1, 1)->buffer});
  verify_programs(one.programs, options_for(one));

  // Two devices, two chunks: stage 1 (device 1) -> stage 2 (device 0) wraps around.
  testing::Lowered two = testing::lower(testing::looped({.num_devices = 2, .chunks = 2}, 2),
                                        {.num_devices = 2, .chunks = 2}, 2);
  EXPECT_EQ(count_ops(two.programs[0], Op::SendActivationStart), 4);  // stages 0 -> 1 and 2 -> 3
  EXPECT_EQ(count_ops(two.programs[1], Op::SendActivationStart), 2);  // stage 1 -> 2; 3 is last
  verify_programs(two.programs, options_for(two));
}

TEST(LoweringTest, ZeroBubbleSplitsBackward) {
  testing::Lowered zb = testing::lower(testing::one_f_one_b(3, 4, /*split=*/true), {.num_devices = 3}, 4);
  for (const ExecutorProgram& program : zb.programs) {
    EXPECT_EQ(count_ops(program, Op::Backward), 0);
    EXPECT_EQ(count_ops(program, Op::BackwardInput), 4);
    EXPECT_EQ(count_ops(program, Op::BackwardWeight), 4);
    for (const Instruction& in : program.instructions) {
      if (in.op == Op::BackwardWeight) {
        EXPECT_EQ(in.buffer, -1);
        EXPECT_TRUE(in.inputs.empty());
      }
    }
  }
  // Gradients leave from BackwardInput: rank 1 sends 4 to rank 0.
  EXPECT_EQ(count_ops(zb.programs[1], Op::SendGradStart), 4);
  verify_programs(zb.programs, options_for(zb));
}

TEST(LoweringTest, ReduceGradsOnlyWithDataParallelism) {
  testing::Lowered single = testing::lower(testing::one_f_one_b(2, 2), {.num_devices = 2}, 2);
  EXPECT_EQ(count_ops(single.programs[0], Op::ReduceGrads), 0);
  testing::Lowered r1 = testing::lower(testing::one_f_one_b(2, 2), {.num_devices = 2}, 2, ModelKind::Gpt, 1, 2);
  EXPECT_EQ(r1.programs[0].rank, 2);
  EXPECT_EQ(r1.programs[1].rank, 3);
  EXPECT_EQ(r1.programs[1].instructions.end()[-2].op, Op::ReduceGrads);
  EXPECT_EQ(r1.programs[1].instructions.back().op, Op::OptimizerStep);
  // Peers stay inside the replica.
  for (const Instruction& in : r1.programs[0].instructions) {
    if (is_communication(in.op)) {
      EXPECT_EQ(in.peer, 3);
    }
  }
}

TEST(LoweringTest, ManyShapesVerifyWithCommunicationDelays) {
  for (int devices : {1, 2, 3, 4}) {
    for (int mbs : {1, 2, 5, 8}) {
      for (double comm : {0.0, 0.5, 3.0}) {
        for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
          SCOPED_TRACE(cat("D=", devices, " M=", mbs, " comm=", comm, " ", model_kind_name(model)));
          for (ScheduleOrder order : {testing::one_f_one_b(devices, mbs), testing::gpipe(devices, mbs),
                                      testing::one_f_one_b(devices, mbs, true)}) {
            testing::Lowered l = testing::lower(order, {.num_devices = devices}, mbs, model, 0, 1, comm);
            EXPECT_NO_THROW(verify_programs(l.programs, options_for(l)));
          }
          PipelineLayout interleaved{.num_devices = devices, .chunks = 2};
          testing::Lowered l = testing::lower(testing::looped(interleaved, mbs), interleaved, mbs, model, 0, 1, comm);
          EXPECT_NO_THROW(verify_programs(l.programs, options_for(l)));
        }
      }
    }
  }
}

// The critical-path schedule's orders (built on random unequal micro-batches, split and
// whole backward, memory limits) lower to programs the verifier accepts: no deadlock.
TEST(LoweringTest, CriticalPathOrdersLowerAndVerify) {
  for (int n = 0; n < 60; ++n) {
    Rng rng(500 + static_cast<std::uint64_t>(n));
    const int devices = static_cast<int>(rng.uniform_int(1, 4));
    const int mbs = static_cast<int>(rng.uniform_int(1, 9));
    PipelineProblem problem = testing::random_problem(rng, mbs, devices, 1);
    if (n % 2 == 0) {
      for (auto& per_stage : problem.costs) {
        for (StageCost& c : per_stage) c.bwd_input_ms = c.bwd_weight_ms = 0;
      }
    }
    if (n % 3 == 0) problem.memory_limit_bytes = 1500;
    const std::optional<ScheduleOrder> order =
        make_schedule(ScheduleKind::CriticalPath)->build(problem, nullptr);
    ASSERT_TRUE(order.has_value());
    for (ModelKind model : {ModelKind::Gpt, ModelKind::T5}) {
      SCOPED_TRACE(cat("n=", n, " D=", devices, " M=", mbs, " ", model_kind_name(model)));
      testing::Lowered l = testing::lower(*order, {.num_devices = devices}, mbs, model, 0, 1, n % 4 * 0.5);
      EXPECT_NO_THROW(verify_programs(l.programs, options_for(l)));
    }
  }
}

TEST(LoweringTest, RejectsInconsistentInput) {
  PipelineLayout layout{.num_devices = 2};
  ScheduleOrder order = testing::one_f_one_b(2, 2);
  SimResult sim = testing::simulate(order, layout, 2);
  LoweringInput in;
  in.hidden = 16;
  in.layout = layout;
  in.microbatches = {{2, 8, 0}, {1, 16, 0}};
  in.stages = testing::gpt_stages(2);
  in.order = &order;
  in.sim = &sim;
  ScheduleOrder missing = order;
  missing.device_ops[1].pop_back();
  in.order = &missing;
  try {
    lower_to_programs(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("(mb 1, stage 1)"));
  }
  ScheduleOrder wrong_device = order;
  std::swap(wrong_device.device_ops[0], wrong_device.device_ops[1]);
  in.order = &wrong_device;
  EXPECT_THROW(lower_to_programs(in), Error);
  in.order = &order;
  in.stages.pop_back();
  EXPECT_THROW(lower_to_programs(in), Error);
}

TEST(LoweringTest, Deterministic) {
  testing::Lowered a = testing::lower(testing::one_f_one_b(4, 8), {.num_devices = 4}, 8, ModelKind::T5, 0, 1, 0.5);
  testing::Lowered b = testing::lower(testing::one_f_one_b(4, 8), {.num_devices = 4}, 8, ModelKind::T5, 0, 1, 0.5);
  EXPECT_EQ(a.programs, b.programs);
}

}  // namespace
}  // namespace dynapipe
