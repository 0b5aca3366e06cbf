// Exports of a schedule for people and other tools:
//   - Chrome trace JSON of a timeline (opens in Perfetto or chrome://tracing);
//   - a static SVG timeline (one row per device, coloured F/B/I/W boxes labelled by mb);
//   - the PyTorch pipelining action CSV (torch.distributed.pipelining, format
//     "compute_only", current vocabulary) and an importer of it.
//
//   write_file("trace.json", timeline_chrome_trace(sim.timeline));
//   ScheduleOrder order = order_from_pytorch_csv(text, layout, "zb1p.csv");
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "dynapipe/schedule/pipeline.h"

namespace dynapipe {

struct ChromeTraceOptions {
  bool track_per_stage = false;  // false: one track per device; true: one per virtual stage
  int pid = 0;                   // process id of every event (e.g. the replica)
  std::string process_name = "pipeline";
};

// {"traceEvents": [...], "displayTimeUnit": "ms"}: one complete ("X") event per op named
// "F3" / "B3" / "I3" / "W3" (kind + mb), microseconds, args {mb, stage, device}, and
// thread_name metadata "device d" / "stage s". Deterministic.
std::string timeline_chrome_trace(const std::vector<TimedOp>& timeline,
                                  const ChromeTraceOptions& options = {});

struct SvgOptions {
  int width_px = 1000;     // drawing width of the time axis; >= 100
  int row_height_px = 28;  // per device; >= 10
  std::string title;       // optional caption above the rows
};

// A self-contained SVG: one row per device, a box per op (F blue, B green, I orange,
// W purple) labelled by its mb, a time axis in ms with ~10 ticks. Deterministic.
std::string timeline_svg(const std::vector<TimedOp>& timeline, const SvgOptions& options = {});

// PyTorch pipelining action CSV, format "compute_only": one row per rank (= device), one
// cell per op "<stage><TYPE><mb>" with TYPE in the current vocabulary (F forward, I
// backward-input, W backward-weight, B full backward); see docs/plan-format.md for the
// version this follows. Rows end with "\n".
std::string order_to_pytorch_csv(const ScheduleOrder& order);

// Reads such a CSV (blank cells = idle slots are skipped; "\r\n" accepted) into a
// ScheduleOrder for `layout` (stage s must sit on rank s % num_devices). Validates: one
// row per device, each cell well-formed, F/I/W/B only (comm actions and the old "BW"
// spelling are rejected), every (stage, mb) runs F once and B once or I and W once each,
// backward after forward, W after I, on the owning rank. Throws ParseError naming
// `where`, the row (rank) and the cell.
ScheduleOrder order_from_pytorch_csv(const std::string& text, const PipelineLayout& layout,
                                     const std::string& where);

}  // namespace dynapipe
