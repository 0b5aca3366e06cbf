// dynapipe.Planner, load_samples(), Samples and GlobalBatch. Planning releases the GIL:
// Planner::plan_iteration() is const and thread-safe, so Python threads plan in parallel.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <unordered_set>

#include "bindings.h"
#include "dynapipe/core/parallel.h"
#include "dynapipe/core/strings.h"
#include "dynapipe/cost/cost_model.h"
#include "dynapipe/cost/device_spec.h"
#include "dynapipe/cost/model_spec.h"
#include "dynapipe/data/dataset.h"
#include "dynapipe/data/global_batch.h"
#include "dynapipe/data/truncation.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/planner/planner.h"
#include "options.h"

namespace dynapipe::python {
namespace {

struct PyPlanner {
  PlanOptions options;
  std::shared_ptr<const Planner> planner;
};

using Samples = std::shared_ptr<const Dataset>;

std::vector<std::int64_t> sample_field(const std::vector<Sample>& samples, int which) {
  std::vector<std::int64_t> out;
  out.reserve(samples.size());
  for (const Sample& s : samples) {
    out.push_back(which == 0 ? s.id : which == 1 ? s.input_len : s.target_len);
  }
  return out;
}

// A global batch from lengths given in Python, truncated the way Dataset::load truncates.
// GPT samples may have no target (target 0: the whole sequence is the sample).
GlobalBatch batch_from_lengths(const PlanConfig& config, py::handle input_lens, py::handle target_lens,
                               py::handle ids, std::int64_t index) {
  const std::vector<std::int64_t> inputs = to_int_vector(input_lens, "input_lens");
  std::vector<std::int64_t> targets;
  const bool t5 = config.model.kind == ModelKind::T5;
  if (!target_lens.is_none()) {
    targets = to_int_vector(target_lens, "target_lens");
    if (targets.size() != inputs.size()) {
      throw Error(ErrorKind::InvalidArgument, cat("target_lens must have as many values as input_lens (",
                                                  inputs.size(), "), got ", targets.size()));
    }
  } else if (t5) {
    throw Error(ErrorKind::InvalidArgument,
                cat("target_lens must be given for the encoder-decoder model ", config.model.name));
  } else {
    targets.assign(inputs.size(), 0);
  }
  std::vector<std::int64_t> sample_ids;
  if (!ids.is_none()) {
    sample_ids = to_int_vector(ids, "ids");
    if (sample_ids.size() != inputs.size()) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("ids must have as many values as input_lens (", inputs.size(), "), got ", sample_ids.size()));
    }
    std::unordered_set<std::int64_t> seen;
    for (std::int64_t id : sample_ids) {
      if (!seen.insert(id).second) {
        throw Error(ErrorKind::InvalidArgument, cat("ids must be unique, got ", id, " twice"));
      }
    }
  }
  if (inputs.empty()) throw Error(ErrorKind::InvalidArgument, "input_lens must not be empty");
  const TruncationLimits limits = truncation_limits(config);
  GlobalBatch batch;
  batch.index = index;
  batch.samples.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] < 1) {
      throw Error(ErrorKind::InvalidArgument, cat("input_lens[", i, "] must be >= 1, got ", inputs[i]));
    }
    const std::int64_t min_target = t5 ? 1 : 0;
    if (targets[i] < min_target) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("target_lens[", i, "] must be >= ", min_target, ", got ", targets[i]));
    }
    TruncatedLengths cut;
    if (targets[i] == 0) {  // GPT without target: only max_seqlen applies
      cut.input_len = std::min(inputs[i], config.max_seqlen);
      cut.truncated = cut.input_len < inputs[i];
    } else {
      cut = truncate_lengths(inputs[i], targets[i], limits);
    }
    Sample s;
    s.id = ids.is_none() ? static_cast<SampleId>(i) : sample_ids[i];
    s.input_len = static_cast<std::int32_t>(cut.input_len);
    s.target_len = static_cast<std::int32_t>(cut.target_len);
    batch.samples.push_back(s);
    if (cut.truncated) batch.truncated_ids.push_back(s.id);
  }
  return batch;
}

MicroBatchShape shape_arg(py::handle shape, ModelKind kind) {
  const std::vector<std::int64_t> dims = to_int_vector(shape, "shape");
  const std::size_t want = kind == ModelKind::T5 ? 3 : 2;
  if (dims.size() != want) {
    throw Error(ErrorKind::InvalidArgument,
                cat("shape must be ", kind == ModelKind::T5 ? "(batch, enc_seqlen, dec_seqlen)" : "(batch, seqlen)",
                    ", got ", dims.size(), " values"));
  }
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1 || dims[i] > (std::int64_t{1} << 24)) {
      throw Error(ErrorKind::InvalidArgument, cat("shape[", i, "] must be in [1, 16777216], got ", dims[i]));
    }
  }
  MicroBatchShape s;
  s.batch = dims[0];
  s.seqlen = dims[1];
  if (kind == ModelKind::T5) s.dec_seqlen = dims[2];
  return s;
}

Samples load(const PlanConfig& config, py::handle path) {
  const std::string file = to_path(path, "path");
  py::gil_scoped_release release;
  return std::make_shared<const Dataset>(Dataset::load(file, truncation_limits(config)));
}

}  // namespace

void bind_planner(py::module_& m) {
  py::class_<Dataset, std::shared_ptr<Dataset>>(m, "Samples",
                                                 "The samples of a samples file, truncated, in file order.")
      .def("__len__", [](const Dataset& d) { return d.samples().size(); })
      .def_property_readonly("ids", [](const Dataset& d) { return sample_field(d.samples(), 0); })
      .def_property_readonly("input_lens", [](const Dataset& d) { return sample_field(d.samples(), 1); })
      .def_property_readonly("target_lens", [](const Dataset& d) { return sample_field(d.samples(), 2); })
      .def_property_readonly("tasks", [](const Dataset& d) {
        std::vector<std::string> out;
        for (const Sample& s : d.samples()) out.push_back(d.task_name(s.task));
        return out;
      }, "Task name per sample ('' when none).")
      .def_property_readonly("truncated_ids", [](const Dataset& d) { return d.truncated_ids(); })
      .def("tokens", [](const Dataset& d, py::handle id) {
        const SampleTokens t = d.tokens(to_int(id, "id"));
        return py::make_tuple(t.input, t.target);
      }, py::arg("id"), "(input tokens, target tokens) of a sample: byte tokens for text, synthetic otherwise.");

  py::class_<GlobalBatch>(m, "GlobalBatch", "The samples of one iteration (Planner.global_batches()).")
      .def_readonly("index", &GlobalBatch::index)
      .def("__len__", [](const GlobalBatch& b) { return b.samples.size(); })
      .def_property_readonly("ids", [](const GlobalBatch& b) { return sample_field(b.samples, 0); })
      .def_property_readonly("input_lens", [](const GlobalBatch& b) { return sample_field(b.samples, 1); })
      .def_property_readonly("target_lens", [](const GlobalBatch& b) { return sample_field(b.samples, 2); })
      .def_readonly("truncated_ids", &GlobalBatch::truncated_ids);

  py::class_<PyPlanner>(m, "Planner", "Plans global batches: micro-batches, schedule, instructions.")
      .def(py::init([](const py::kwargs& kwargs) {
             PyPlanner p;
             p.options = options_from_kwargs(kwargs);
             const PlanConfig config = to_plan_config(p.options);
             py::gil_scoped_release release;
             p.planner = std::make_shared<const Planner>(config);
             return p;
           }),
           "Planner(**options): the options of `dynapipe plan` (see plan_options()), same defaults\n"
           "and validation; raises dynapipe.InvalidArgument with the CLI's message.")
      .def_property_readonly("options", [](const PyPlanner& p) { return options_to_dict(p.options); },
                             "The options as given (defaults filled in).")
      .def_property_readonly("model_kind", [](const PyPlanner& p) {
        return std::string(model_kind_name(p.planner->config().model.kind));
      })
      .def_property_readonly("config_json", [](const PyPlanner& p) {
        ExecutionPlan only_config;
        only_config.config = p.planner->config();
        return plan_to_json(only_config, -1);
      }, "A plan JSON with this config (memory limit resolved) and no iterations, one line.")
      .def("plan", [](const PyPlanner& p, py::handle input_lens, py::handle target_lens, py::handle ids,
                      py::handle index, int threads) {
             checked_thread_count(threads, "threads");
             GlobalBatch batch;
             if (py::isinstance<GlobalBatch>(input_lens)) {
               if (!target_lens.is_none() || !ids.is_none() || !index.is_none()) {
                 throw Error(ErrorKind::InvalidArgument,
                             "target_lens, ids and index must be None when planning a GlobalBatch");
               }
               batch = input_lens.cast<GlobalBatch>();
             } else {
               const std::int64_t i = index.is_none() ? 0 : to_int(index, "index");
               if (i < 0) throw Error(ErrorKind::InvalidArgument, cat("index must be >= 0, got ", i));
               batch = batch_from_lengths(p.planner->config(), input_lens, target_lens, ids, i);
             }
             py::gil_scoped_release release;
             return p.planner->plan_iteration(batch, threads);
           },
           py::arg("input_lens"), py::arg("target_lens") = py::none(), py::kw_only(), py::arg("ids") = py::none(),
           py::arg("index") = py::none(), py::arg("threads") = 1,
           "Plans one global batch. input_lens/target_lens: lists or buffer-protocol arrays of ints\n"
           "(GPT: target_lens may be None; T5: required), truncated like the samples file; ids default\n"
           "to 0..n-1. Also accepts a GlobalBatch. Releases the GIL while planning. threads: how many\n"
           "threads this one plan may use (0: one per hardware thread); the plan is the same for any.")
      .def_property_readonly("cost_model", [](const PyPlanner& p) { return p.planner->base_cost_model().describe(); },
                             "The cost model as configured, e.g. 'analytic:a100-40g' or 'profile:<path>'.")
      .def_property_readonly("num_stages", [](const PyPlanner& p) { return p.planner->cost_model().num_stages(); })
      .def("stage_cost", [](const PyPlanner& p, py::handle stage, py::handle shape, py::handle recompute) {
             const CostModel& cost = p.planner->cost_model();
             const std::int64_t s = to_int(stage, "stage");
             if (s < 0 || s >= cost.num_stages()) {
               throw Error(ErrorKind::InvalidArgument,
                           cat("stage must be in [0, ", cost.num_stages() - 1, "], got ", s));
             }
             const std::string mode = to_str(recompute, "recompute");
             const std::optional<Recompute> r = parse_recompute(mode);
             if (!r) {
               throw Error(ErrorKind::InvalidArgument,
                           cat("recompute must be one of none, selective, full, got \"", mode, "\""));
             }
             const StageCost c = cost.stage_cost(static_cast<int>(s), shape_arg(shape, p.planner->config().model.kind),
                                                 AttentionDensity{}, *r);
             py::dict d;
             d["fwd_ms"] = c.fwd_ms;
             d["bwd_ms"] = c.bwd_ms;
             d["bwd_input_ms"] = c.bwd_input_ms;
             d["bwd_weight_ms"] = c.bwd_weight_ms;
             d["stored_bytes"] = c.stored_bytes;
             d["peak_bytes"] = c.peak_bytes;
             d["output_bytes"] = c.output_bytes;
             d["static_bytes"] = cost.static_bytes(static_cast<int>(s));
             return d;
           },
           py::arg("stage"), py::arg("shape"), py::arg("recompute") = "none",
           "The cost model's estimate for one micro-batch of `shape` ((batch, seqlen); T5:\n"
           "(batch, enc_seqlen, dec_seqlen)) on `stage`: fwd_ms, bwd_ms, bwd_input_ms, bwd_weight_ms,\n"
           "stored_bytes, peak_bytes, output_bytes, and the stage's static_bytes (weights, grads,\n"
           "optimizer states).")
      .def("load_samples", [](const PyPlanner& p, py::handle path) { return load(p.planner->config(), path); },
           py::arg("path"), "Reads a samples file truncated by this planner's limits.")
      .def("global_batches", [](const PyPlanner& p, const Dataset& samples) {
             const PlanConfig& c = p.planner->config();
             return form_global_batches(samples, c.global_batch_tokens, c.iterations);
           },
           py::arg("samples"), "The global batches `dynapipe plan` forms (global_batch_tokens, iterations).");

  m.def("model_presets", [] { return model_preset_names(); }, "Names of the model presets (`model=`).");
  m.def("device_presets", [] { return device_preset_names(); },
        "Device presets of the analytic cost model (`cost_model=\"analytic:<name>\"`).");
  m.def("load_samples", [](py::handle path, const py::kwargs& kwargs) {
          return load(to_plan_config(options_from_kwargs(kwargs)), path);
        },
        py::arg("path"),
        "load_samples(path, **options): a samples file (JSONL, optionally gzip) truncated by the\n"
        "options' model, max_seqlen and max_target_len (Planner's defaults).");
}

}  // namespace dynapipe::python
