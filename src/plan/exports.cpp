// Exports: Chrome trace, SVG timeline, PyTorch pipelining action CSV (+ importer).
#include "dynapipe/plan/exports.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

using Json = nlohmann::ordered_json;

const char* op_colour(OpKind kind) {
  switch (kind) {
    case OpKind::F: return "#4e79a7";
    case OpKind::B: return "#59a14f";
    case OpKind::I: return "#f28e2b";
    case OpKind::W: return "#b07aa1";
  }
  return "#999999";
}

// Fixed two decimals: stable across platforms, enough for pixels.
std::string px(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.2f", v);
  return buffer;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A 1-2-5 step giving at most ~10 ticks over [0, span].
double tick_step(double span) {
  if (!(span > 0)) return 1;
  double raw = span / 10;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

}  // namespace

std::string timeline_chrome_trace(const std::vector<TimedOp>& timeline, const ChromeTraceOptions& options) {
  Json events = Json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", options.pid},
                    {"args", {{"name", options.process_name}}}});
  std::vector<int> tracks;
  for (const TimedOp& t : timeline) tracks.push_back(options.track_per_stage ? t.op.stage : t.device);
  std::sort(tracks.begin(), tracks.end());
  tracks.erase(std::unique(tracks.begin(), tracks.end()), tracks.end());
  for (int track : tracks) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", options.pid}, {"tid", track},
                      {"args", {{"name", cat(options.track_per_stage ? "stage " : "device ", track)}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", options.pid}, {"tid", track},
                      {"args", {{"sort_index", track}}}});
  }
  for (const TimedOp& t : timeline) {
    std::string kind(1, op_kind_letter(t.op.kind));
    events.push_back({{"name", cat(kind, t.op.mb)},
                      {"cat", kind},
                      {"ph", "X"},
                      {"pid", options.pid},
                      {"tid", options.track_per_stage ? t.op.stage : t.device},
                      {"ts", t.start_ms * 1000.0},
                      {"dur", std::max(0.0, t.end_ms - t.start_ms) * 1000.0},
                      {"args", {{"mb", t.op.mb}, {"stage", t.op.stage}, {"device", t.device}}}});
  }
  Json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string timeline_svg(const std::vector<TimedOp>& timeline, const SvgOptions& options) {
  const double width = std::max(options.width_px, 100);
  const double row = std::max(options.row_height_px, 10);
  const double left = 72, top = options.title.empty() ? 10 : 32, axis = 34;
  int devices = 1;
  double span = 0;
  for (const TimedOp& t : timeline) {
    devices = std::max(devices, t.device + 1);
    if (std::isfinite(t.end_ms)) span = std::max(span, t.end_ms);
  }
  const double scale = span > 0 ? width / span : 0;
  const double height = top + devices * row + axis;
  std::string svg = cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", px(left + width + 16), "\" height=\"",
                        px(height), "\" font-family=\"sans-serif\" font-size=\"11\">\n");
  svg += cat("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  if (!options.title.empty()) {
    svg += cat("<text x=\"", px(left), "\" y=\"20\" font-size=\"14\">", xml_escape(options.title), "</text>\n");
  }
  for (int d = 0; d < devices; ++d) {
    double y = top + d * row;
    svg += cat("<text x=\"", px(left - 8), "\" y=\"", px(y + row / 2 + 4), "\" text-anchor=\"end\">device ", d,
               "</text>\n");
    svg += cat("<rect x=\"", px(left), "\" y=\"", px(y + 1), "\" width=\"", px(width), "\" height=\"", px(row - 2),
               "\" fill=\"#f3f3f3\"/>\n");
  }
  for (const TimedOp& t : timeline) {
    if (t.device < 0 || !std::isfinite(t.start_ms) || !std::isfinite(t.end_ms)) continue;
    double x = left + t.start_ms * scale, w = std::max((t.end_ms - t.start_ms) * scale, 0.5);
    double y = top + t.device * row;
    svg += cat("<rect x=\"", px(x), "\" y=\"", px(y + 2), "\" width=\"", px(w), "\" height=\"", px(row - 4),
               "\" fill=\"", op_colour(t.op.kind), "\" stroke=\"white\" stroke-width=\"0.5\"><title>",
               op_kind_letter(t.op.kind), t.op.mb, " stage ", t.op.stage, ": ", t.start_ms, "-", t.end_ms,
               " ms</title></rect>\n");
    if (w >= 12) {
      svg += cat("<text x=\"", px(x + w / 2), "\" y=\"", px(y + row / 2 + 4),
                 "\" text-anchor=\"middle\" fill=\"white\">", t.op.mb, "</text>\n");
    }
  }
  double axis_y = top + devices * row + 4;
  svg += cat("<line x1=\"", px(left), "\" y1=\"", px(axis_y), "\" x2=\"", px(left + width), "\" y2=\"", px(axis_y),
             "\" stroke=\"black\"/>\n");
  double step = tick_step(span);
  for (int i = 0; span > 0 && i * step <= span * (1 + 1e-9) && i <= 100; ++i) {
    double x = left + i * step * scale;
    svg += cat("<line x1=\"", px(x), "\" y1=\"", px(axis_y), "\" x2=\"", px(x), "\" y2=\"", px(axis_y + 4),
               "\" stroke=\"black\"/>\n");
    svg += cat("<text x=\"", px(x), "\" y=\"", px(axis_y + 16), "\" text-anchor=\"middle\">", i * step, "</text>\n");
  }
  svg += cat("<text x=\"", px(left + width), "\" y=\"", px(axis_y + 30), "\" text-anchor=\"end\">time (ms)</text>\n");
  svg += "</svg>\n";
  return svg;
}

std::string order_to_pytorch_csv(const ScheduleOrder& order) {
  std::string out;
  for (const auto& ops : order.device_ops) {
    bool first = true;
    for (const PipelineOp& op : ops) {
      if (!first) out += ',';
      out += cat(op.stage, op_kind_letter(op.kind), op.mb);
      first = false;
    }
    out += '\n';
  }
  return out;
}

ScheduleOrder order_from_pytorch_csv(const std::string& text, const PipelineLayout& layout,
                                     const std::string& where) {
  auto fail = [&](const std::string& what) -> void { throw Error(ErrorKind::ParseError, cat(where, ": ", what)); };
  if (layout.num_devices < 1 || layout.chunks < 1) {
    throw Error(ErrorKind::InvalidArgument, cat(where, ": layout must have num_devices >= 1 and chunks >= 1"));
  }
  std::vector<std::string> lines = split(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
  for (std::string& line : lines) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
  }
  if (static_cast<int>(lines.size()) != layout.num_devices) {
    fail(cat("the CSV must have one row per rank (", layout.num_devices, "), got ", lines.size()));
  }
  const int stages = layout.num_stages();
  ScheduleOrder order;
  order.device_ops.resize(layout.num_devices);
  int num_mbs = 0;
  for (int rank = 0; rank < layout.num_devices; ++rank) {
    std::vector<std::string> cells = split(lines[rank], ',');
    for (std::size_t c = 0; c < cells.size(); ++c) {
      std::string cell = cells[c];
      while (!cell.empty() && cell.front() == ' ') cell.erase(cell.begin());
      while (!cell.empty() && cell.back() == ' ') cell.pop_back();
      if (cell.empty()) continue;  // an idle slot
      std::string at = cat("row ", rank, " cell ", c);
      std::size_t i = 0;
      auto number = [&](std::size_t& pos) {
        std::size_t begin = pos;
        while (pos < cell.size() && pos - begin < 10 && std::isdigit(static_cast<unsigned char>(cell[pos]))) ++pos;
        if (pos == begin || pos - begin > 9) return -1;
        return std::stoi(cell.substr(begin, pos - begin));
      };
      int stage = number(i);
      std::size_t type_begin = i;
      while (i < cell.size() && !std::isdigit(static_cast<unsigned char>(cell[i]))) ++i;
      std::string type = cell.substr(type_begin, i - type_begin);
      int mb = number(i);
      if (type == "BW") {
        fail(cat(at, " must use the current vocabulary (B = full backward, I = input, W = weight), got \"", cell,
                 "\" in the older one"));
      }
      if (type.find("SEND") != std::string::npos || type.find("RECV") != std::string::npos ||
          type.find("SHARD") != std::string::npos || type.find("REDUCE") != std::string::npos ||
          cell.find("OVERLAP") != std::string::npos) {
        fail(cat(at, " must be a compute action (format compute_only: F, I, B, W), got \"", cell, "\""));
      }
      if (stage < 0 || mb < 0 || i != cell.size() || type.size() != 1 || std::string("FIBW").find(type) == std::string::npos) {
        fail(cat(at, " must be \"<stage><F|I|B|W><mb>\", got \"", cell, "\""));
      }
      if (stage >= stages) fail(cat(at, " stage must be < ", stages, ", got ", stage));
      if (layout.device_of(stage) != rank) {
        fail(cat(at, " stage ", stage, " must be on rank ", layout.device_of(stage), " (stage % ", layout.num_devices,
                 "), got rank ", rank));
      }
      OpKind kind = type == "F" ? OpKind::F : type == "B" ? OpKind::B : type == "I" ? OpKind::I : OpKind::W;
      order.device_ops[rank].push_back({mb, stage, kind});
      num_mbs = std::max(num_mbs, mb + 1);
    }
  }
  std::size_t total = 0;
  for (const auto& ops : order.device_ops) total += ops.size();
  if (static_cast<std::size_t>(num_mbs) * stages > total) {
    fail(cat("micro-batches must be numbered 0.. without gaps and run on every stage, got ids up to ", num_mbs - 1,
             " in only ", total, " actions"));
  }
  // Completeness and order per (stage, mb): F once; B once or I then W once each.
  std::vector<std::array<int, 4>> seen(static_cast<std::size_t>(num_mbs) * stages, {-1, -1, -1, -1});
  for (int rank = 0; rank < layout.num_devices; ++rank) {
    const auto& ops = order.device_ops[rank];
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const PipelineOp& op = ops[k];
      auto& slot = seen[static_cast<std::size_t>(op.mb) * stages + op.stage];
      int& position = slot[static_cast<int>(op.kind)];
      std::string name = cat(op.stage, op_kind_letter(op.kind), op.mb);
      if (position >= 0) fail(cat("row ", rank, ": ", name, " must appear once, got twice"));
      position = static_cast<int>(k);
      if (op.kind != OpKind::F && slot[0] < 0) fail(cat("row ", rank, ": ", name, " must come after ", op.stage, "F", op.mb));
      if (op.kind == OpKind::W && slot[2] < 0) fail(cat("row ", rank, ": ", name, " must come after ", op.stage, "I", op.mb));
    }
  }
  for (int mb = 0; mb < num_mbs; ++mb) {
    for (int s = 0; s < stages; ++s) {
      const auto& slot = seen[static_cast<std::size_t>(mb) * stages + s];
      bool complete = slot[0] >= 0 && ((slot[1] >= 0) != (slot[2] >= 0)) && ((slot[2] >= 0) == (slot[3] >= 0));
      if (!complete) {
        std::string got;
        for (int k = 0; k < 4; ++k) {
          if (slot[k] >= 0) got += op_kind_letter(static_cast<OpKind>(k));
        }
        fail(cat("stage ", s, " micro-batch ", mb, " must run F and then B, or F, I and W, got ",
                 got.empty() ? "nothing" : got));
      }
    }
  }
  return order;
}

}  // namespace dynapipe
