#include "dynapipe/plan/exports.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "dynapipe/core/error.h"
#include "plan/test_pipelines.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string csv_error(const std::string& text, PipelineLayout layout = {.num_devices = 2}) {
  try {
    order_from_pytorch_csv(text, layout, "zb.csv");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ParseError);
    return e.what();
  }
  ADD_FAILURE() << "accepted " << text;
  return "";
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ExportsTest, ChromeTraceHasOneEventPerOpOnDeviceTracks) {
  testing::Lowered l = testing::lower(testing::one_f_one_b(2, 2, true), {.num_devices = 2}, 2);
  Json trace = Json::parse(timeline_chrome_trace(l.sim.timeline));
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  int ops = 0;
  std::set<std::string> names;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++ops;
    names.insert(e["name"].get<std::string>());
    EXPECT_EQ(e["tid"], e["args"]["device"]);
  }
  EXPECT_EQ(ops, static_cast<int>(l.sim.timeline.size()));
  EXPECT_EQ(names, (std::set<std::string>{"F0", "F1", "I0", "I1", "W0", "W1"}));
  Json first = trace["traceEvents"][5];
  EXPECT_EQ(first["name"], "F0");
  EXPECT_EQ(first["ts"], 0.0);
  EXPECT_EQ(first["dur"], 1000.0);  // 1 ms in microseconds

  Json by_stage = Json::parse(timeline_chrome_trace(l.sim.timeline, {.track_per_stage = true, .pid = 3}));
  EXPECT_EQ(by_stage["traceEvents"][1]["args"]["name"], "stage 0");
  EXPECT_EQ(by_stage["traceEvents"][1]["pid"], 3);
}

TEST(ExportsTest, SvgDrawsOneBoxPerOpAndAnAxis) {
  testing::Lowered l = testing::lower(testing::one_f_one_b(3, 4), {.num_devices = 3}, 4);
  std::string svg = timeline_svg(l.sim.timeline, {.title = "1F1B <3 x 4>"});
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  EXPECT_EQ(count(svg, "<title>"), static_cast<int>(l.sim.timeline.size()));
  EXPECT_EQ(count(svg, ">device "), 3);
  EXPECT_THAT(svg, HasSubstr("1F1B &lt;3 x 4&gt;"));
  EXPECT_THAT(svg, HasSubstr("time (ms)"));
  EXPECT_THAT(svg, HasSubstr("#4e79a7"));  // forward
  EXPECT_THAT(svg, HasSubstr("#59a14f"));  // backward
  EXPECT_EQ(svg, timeline_svg(l.sim.timeline, {.title = "1F1B <3 x 4>"}));
  EXPECT_THAT(timeline_svg({}), HasSubstr("</svg>"));
}

TEST(ExportsTest, PytorchCsvInCurrentVocabulary) {
  EXPECT_EQ(order_to_pytorch_csv(testing::one_f_one_b(2, 2)), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  EXPECT_EQ(order_to_pytorch_csv(testing::one_f_one_b(2, 2, true)), "0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n");
  for (ScheduleOrder order : {testing::one_f_one_b(4, 6), testing::one_f_one_b(3, 5, true)}) {
    PipelineLayout layout{.num_devices = static_cast<int>(order.device_ops.size())};
    std::string csv = order_to_pytorch_csv(order);
    ScheduleOrder back = order_from_pytorch_csv(csv, layout, "x.csv");
    EXPECT_EQ(back.device_ops, order.device_ops);
  }
  PipelineLayout looped{.num_devices = 2, .chunks = 2};
  ScheduleOrder interleaved = testing::looped(looped, 3);
  EXPECT_EQ(order_from_pytorch_csv(order_to_pytorch_csv(interleaved), looped, "x.csv").device_ops, interleaved.device_ops);
}

TEST(ExportsTest, PytorchCsvImportAcceptsBlanksAndCrlf) {
  ScheduleOrder order = order_from_pytorch_csv("0F0,,0F1,0B0,0B1\r\n1F0,1B0,,1F1,1B1\r\n", {.num_devices = 2}, "x.csv");
  EXPECT_EQ(order.device_ops, testing::one_f_one_b(2, 2).device_ops);
}

TEST(ExportsTest, PytorchCsvImportValidates) {
  EXPECT_THAT(csv_error("0F0,0F1,0BW0,0BW1\n1F0,1BW0,1F1,1BW1\n"),
              HasSubstr("zb.csv: row 0 cell 2 must use the current vocabulary"));
  EXPECT_THAT(csv_error("0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n"),
              HasSubstr("row 0 cell 1 must be a compute action (format compute_only: F, I, B, W), got \"0SEND_F0\""));
  EXPECT_THAT(csv_error("0F0,0X0,0B0\n1F0,1B0\n"), HasSubstr("row 0 cell 1 must be \"<stage><F|I|B|W><mb>\", got \"0X0\""));
  EXPECT_THAT(csv_error("0F0,0B0\n"), HasSubstr("must have one row per rank (2), got 1"));
  EXPECT_THAT(csv_error("1F0,0B0\n0F0,1B0\n"), HasSubstr("row 0 cell 0 stage 1 must be on rank 1 (stage % 2), got rank 0"));
  EXPECT_THAT(csv_error("0B0,0F0\n1F0,1B0\n"), HasSubstr("row 0: 0B0 must come after 0F0"));
  EXPECT_THAT(csv_error("0F0,0B0,0F0\n1F0,1B0\n"), HasSubstr("row 0: 0F0 must appear once, got twice"));
  EXPECT_THAT(csv_error("0F0,0B0,0F1,0B1\n1F0,1B0,1F1\n"), HasSubstr("stage 1 micro-batch 1 must run F and then B, or F, I and W, got F"));
  EXPECT_THAT(csv_error("0F0,0B0,0F999999\n1F0,1B0\n"), HasSubstr("micro-batches must be numbered 0.. without gaps"));
  EXPECT_THAT(csv_error("0F0,0I0,0B0,0W0\n1F0,1B0\n"), HasSubstr("stage 0 micro-batch 0 must run F and then B, or F, I and W, got FBIW"));
  EXPECT_THAT(csv_error("9F0,0B0\n1F0,1B0\n"), HasSubstr("row 0 cell 0 stage must be < 2, got 9"));
}

}  // namespace
}  // namespace dynapipe
