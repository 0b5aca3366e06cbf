#include "dynapipe/plan/verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "dynapipe/core/error.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Op = InstructionOp;

VerifyOptions options_for(const testing::Lowered& lowered) {
  VerifyOptions options;
  options.layout = lowered.layout;
  options.num_microbatches = static_cast<int>(lowered.shapes.size());
  return options;
}

// Runs the verifier and returns its message; fails the test if it passes.
std::string failure(const std::vector<ExecutorProgram>& programs, const VerifyOptions& options) {
  try {
    verify_programs(programs, options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), options.error_kind);
    return e.what();
  }
  ADD_FAILURE() << "verify_programs accepted a broken plan";
  return "";
}

std::size_t index_of(const ExecutorProgram& program, Op op, int mb) {
  auto& list = program.instructions;
  auto it = std::find_if(list.begin(), list.end(), [&](const Instruction& in) { return in.op == op && in.mb == mb; });
  EXPECT_NE(it, list.end()) << instruction_op_name(op) << " mb " << mb;
  return static_cast<std::size_t>(it - list.begin());
}

testing::Lowered two_by_four() {
  return testing::lower(testing::one_f_one_b(2, 4), {.num_devices = 2}, 4);
}

TEST(VerifierTest, AcceptsLoweredPlansAcrossReplicas) {
  std::vector<ExecutorProgram> all;
  for (int replica = 0; replica < 2; ++replica) {
    testing::Lowered l = testing::lower(testing::one_f_one_b(3, 5), {.num_devices = 3}, 5, ModelKind::Gpt, replica, 2);
    all.insert(all.end(), l.programs.begin(), l.programs.end());
  }
  VerifyOptions options;
  options.layout = {.num_devices = 3};
  options.num_microbatches = 5;
  VerifyReport report = verify_programs(all, options);
  EXPECT_EQ(report.messages, 2 * 2 * 2 * 5);  // replicas x boundaries x directions x mbs
}

TEST(VerifierTest, RejectsCrossedSendRecvOrder) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[1].instructions;
  // Rank 1 posts its receive for mb 2 before the one for mb 1; rank 0 sends mb 1 first.
  std::size_t r1 = index_of(l.programs[1], Op::RecvActivationStart, 1);
  std::size_t r2 = index_of(l.programs[1], Op::RecvActivationStart, 2);
  std::swap(list[r1], list[r2]);
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr("message #1 from rank 0 to rank 1 does not match: mbs differ (1 vs 2)"));
  EXPECT_THAT(message, HasSubstr("rank 0 #"));
  EXPECT_THAT(message, HasSubstr("rank 1 #"));
  EXPECT_THAT(message, HasSubstr("matched in posting order"));
}

TEST(VerifierTest, RejectsShapeMismatch) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[0].instructions;
  std::size_t start = index_of(l.programs[0], Op::RecvGradStart, 2);
  std::size_t finish = index_of(l.programs[0], Op::RecvGradFinish, 2);
  list[start].shape[1] += 8;
  list[finish].shape[1] += 8;
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr("from rank 1 to rank 0 does not match: shapes differ"));
  EXPECT_THAT(message, HasSubstr(cat("rank 0 #", start, " RecvGradStart(mb 2")));
}

TEST(VerifierTest, RejectsMissingReceive) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[1].instructions;
  // Drop rank 1's receive of mb 3 (start, finish) and have its forward read nothing.
  std::size_t start = index_of(l.programs[1], Op::RecvActivationStart, 3);
  int buffer = list[start].buffer;
  std::erase_if(list, [&](const Instruction& in) {
    return (is_communication(in.op) || in.op == Op::FreeBuffer) && in.buffer == buffer;
  });
  for (Instruction& in : list) std::erase(in.inputs, buffer);
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr("rank 1 #"));
  EXPECT_THAT(message, HasSubstr("Forward(mb 3, stage 1"));
  EXPECT_THAT(message, HasSubstr("must read the activation of the previous stage"));
}

TEST(VerifierTest, ReportsDeadlockWithBlockedInstructions) {
  testing::Lowered l = two_by_four();
  // Rank 0 waits for mb 0's gradient before sending mb 0's activation.
  auto& list = l.programs[0].instructions;
  std::size_t start = index_of(l.programs[0], Op::RecvGradStart, 0);
  std::size_t finish = index_of(l.programs[0], Op::RecvGradFinish, 0);
  Instruction post = list[start], wait = list[finish];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(finish));
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(start));
  list.insert(list.begin(), {post, wait});
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr("deadlock: 2 of 2 executors blocked (wait cycle: rank 0 -> rank 1 -> rank 0)"));
  EXPECT_THAT(message, HasSubstr("rank 0 waits at #1 RecvGradFinish(mb 0, stage 0, peer 1"));
  EXPECT_THAT(message, HasSubstr("for rank 1 to post SendGradStart (message #0 of the pair), which is blocked at #"));
  EXPECT_THAT(message, HasSubstr("rank 1 waits at #2 RecvActivationFinish(mb 0, stage 1, peer 0"));
}

TEST(VerifierTest, RejectsUseAfterFree) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[0].instructions;
  std::size_t forward = index_of(l.programs[0], Op::Forward, 1);
  int input = list[forward].inputs.at(0);
  std::erase_if(list, [&](const Instruction& in) { return in.op == Op::FreeBuffer && in.buffer == input; });
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(forward), Instruction{Op::FreeBuffer, -1, -1, -1, {}, input, {}});
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr(cat("rank 0 #", forward + 1, " Forward(mb 1, stage 0")));
  EXPECT_THAT(message, HasSubstr(cat("input buffer ", input, " is used after its FreeBuffer")));
}

TEST(VerifierTest, RejectsBackwardBeforeForward) {
  testing::Lowered l = testing::lower(testing::gpipe(1, 2), {.num_devices = 1}, 2);
  auto& list = l.programs[0].instructions;
  std::size_t backward = index_of(l.programs[0], Op::Backward, 0);
  Instruction b = list[backward];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(backward));
  list.insert(list.begin(), b);
  std::string message = failure(l.programs, options_for(l));
  EXPECT_THAT(message, HasSubstr("rank 0 #0 Backward(mb 0, stage 0)"));
  EXPECT_THAT(message, HasSubstr("a backward must run after its forward"));
}

TEST(VerifierTest, RejectsReadingAReceiveBeforeItsFinish) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[1].instructions;
  std::size_t finish = index_of(l.programs[1], Op::RecvActivationFinish, 0);
  std::size_t forward = index_of(l.programs[1], Op::Forward, 0);
  Instruction wait = list[finish];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(finish));
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(forward), wait);  // after the forward now
  EXPECT_THAT(failure(l.programs, options_for(l)), HasSubstr("must be complete, got a receive not yet finished"));
}

TEST(VerifierTest, RejectsMissingWorkAndLeaks) {
  testing::Lowered l = two_by_four();
  auto& list = l.programs[1].instructions;
  std::erase_if(list, [](const Instruction& in) { return in.op == Op::FreeBuffer; });
  EXPECT_THAT(failure(l.programs, options_for(l)), HasSubstr("rank 1 must free every buffer by the end"));

  testing::Lowered m = testing::lower(testing::gpipe(1, 2), {.num_devices = 1}, 2);
  VerifyOptions options = options_for(m);
  options.num_microbatches = 3;
  options.error_kind = ErrorKind::InvalidArgument;
  EXPECT_THAT(failure(m.programs, options), HasSubstr("OptimizerStep must come after every forward and backward"));
}

TEST(VerifierTest, ChecksMemory) {
  testing::Lowered l = testing::lower(testing::gpipe(2, 4), {.num_devices = 2}, 4);
  VerifyOptions options = options_for(l);
  options.stored_bytes.assign(4, std::vector<std::int64_t>(2, 1000));
  options.static_bytes = {50, 60};
  options.bytes_per_element = 1;
  VerifyReport report = verify_programs(l.programs, options);
  ASSERT_EQ(report.peak_memory_bytes.size(), 2u);
  // GPipe keeps all 4 micro-batches' activations: 4000 + static + message buffers.
  EXPECT_GE(report.peak_memory_bytes[0], 4050);
  EXPECT_GE(report.peak_memory_bytes[1], 4060);
  options.memory_limit_bytes = 3000;
  EXPECT_THAT(failure(l.programs, options), HasSubstr("memory must stay within the limit of 3000 bytes"));
}

TEST(VerifierTest, NeverCrashesOnGarbageFields) {
  testing::Lowered l = two_by_four();
  VerifyOptions options = options_for(l);
  for (std::size_t i = 0; i < l.programs[1].instructions.size(); ++i) {
    for (int field = 0; field < 5; ++field) {
      auto programs = l.programs;
      Instruction& in = programs[1].instructions[i];
      switch (field) {
        case 0: in.mb = 99; break;
        case 1: in.stage = -3; break;
        case 2: in.peer = 7; break;
        case 3: in.buffer = 12345; break;
        default: in.op = static_cast<Op>(200); break;
      }
      try {
        verify_programs(programs, options);
      } catch (const Error&) {
      }
    }
  }
}

}  // namespace
}  // namespace dynapipe
