// IterationPlan and its parts as Python objects: read-only views over the C++ structs
// (copied out on access), the JSON and binary codecs, and ExecutionPlan.from_json().
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "bindings.h"
#include "dynapipe/plan/plan_binary.h"
#include "dynapipe/plan/plan_json.h"
#include "dynapipe/schedule/schedule.h"

namespace dynapipe::python {
namespace {

// A micro-batch with its estimates and replica, as IterationPlan.microbatches lists them.
struct PyMicroBatch {
  MicroBatch mb;
  MicroBatchEstimate est;
  int replica = 0;
  ModelKind kind = ModelKind::Gpt;
  Recompute recompute = Recompute::None;  // the mode it runs in (its own or its replica's)
};

// The plan formats spell shapes per model kind, and the binary form does not store it:
// a T5 micro-batch always has a decoder length (target + 1 >= 2).
ModelKind infer_kind(const IterationPlan& plan) {
  for (const ReplicaPlan& r : plan.replicas) {
    for (const MicroBatch& mb : r.microbatches) {
      if (mb.shape.dec_seqlen > 0) return ModelKind::T5;
    }
  }
  return ModelKind::Gpt;
}

py::tuple shape_tuple(const MicroBatchShape& s, ModelKind kind) {
  if (kind == ModelKind::T5) return py::make_tuple(s.batch, s.seqlen, s.dec_seqlen);
  return py::make_tuple(s.batch, s.seqlen);
}

py::object optional_int(int v) { return v < 0 ? py::object(py::none()) : py::cast(v); }

std::vector<PyMicroBatch> replica_microbatches(const ReplicaPlan& r, int replica, ModelKind kind) {
  std::vector<PyMicroBatch> out;
  for (std::size_t i = 0; i < r.microbatches.size(); ++i) {
    out.push_back({r.microbatches[i], i < r.estimates.size() ? r.estimates[i] : MicroBatchEstimate{},
                   replica, kind, recompute_of(r.microbatches[i], r.recompute)});
  }
  return out;
}

std::vector<Instruction> instructions_of(const IterationPlan& plan, int rank) {
  for (const ReplicaPlan& r : plan.replicas) {
    for (const ExecutorProgram& e : r.executors) {
      if (e.rank == rank) return e.instructions;
    }
  }
  throw Error(ErrorKind::InvalidArgument, cat("rank must name an executor of this plan, got ", rank));
}

int num_ranks(const IterationPlan& plan) {
  int n = 0;
  for (const ReplicaPlan& r : plan.replicas) n += static_cast<int>(r.executors.size());
  return n;
}

std::string bytes_arg(py::handle data) {
  if (PyBytes_Check(data.ptr())) return data.cast<std::string>();
  if (PyObject_CheckBuffer(data.ptr())) {
    const py::buffer_info info = py::reinterpret_borrow<py::buffer>(data).request();
    return std::string(static_cast<const char*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize));
  }
  throw TypeMismatch(cat("data must be bytes, got ", Py_TYPE(data.ptr())->tp_name));
}

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<Instruction>(m, "Instruction", "One step of an executor's program (docs/plan-format.md).")
      .def_property_readonly("op", [](const Instruction& i) { return std::string(instruction_op_name(i.op)); },
                             "Op name, e.g. 'Forward', 'SendActivationStart'.")
      .def_property_readonly("mb", [](const Instruction& i) { return optional_int(i.mb); },
                             "Micro-batch id, or None.")
      .def_property_readonly("stage", [](const Instruction& i) { return optional_int(i.stage); },
                             "Virtual stage, or None.")
      .def_property_readonly("peer", [](const Instruction& i) { return optional_int(i.peer); },
                             "Peer executor rank (communication), or None.")
      .def_property_readonly("shape", [](const Instruction& i) { return i.shape; },
                             "Communicated tensor shape (compute: shape of its buffer).")
      .def_property_readonly("buffer", [](const Instruction& i) { return optional_int(i.buffer); })
      .def_property_readonly("inputs", [](const Instruction& i) { return i.inputs; })
      .def("__eq__", [](const Instruction& a, const Instruction& b) { return a == b; })
      .def("__repr__", [](const Instruction& i) { return "<" + to_string(i) + ">"; });

  py::class_<PyMicroBatch>(m, "MicroBatch", "One micro-batch: samples, padded shape, estimates.")
      .def_property_readonly("id", [](const PyMicroBatch& b) { return b.mb.id; },
                             "Index within its replica.")
      .def_property_readonly("replica", [](const PyMicroBatch& b) { return b.replica; })
      .def_property_readonly("sample_ids", [](const PyMicroBatch& b) { return b.mb.sample_ids; },
                             "Sample ids in this micro-batch (the indices given to plan()).")
      .def_property_readonly("rows", [](const PyMicroBatch& b) { return b.mb.rows; },
                             "Packing strategies: sample ids per packed row; else empty.")
      .def_property_readonly("shape", [](const PyMicroBatch& b) { return shape_tuple(b.mb.shape, b.kind); },
                             "(batch, seqlen) for GPT; (batch, enc_seqlen, dec_seqlen) for T5.")
      .def_property_readonly("real_tokens", [](const PyMicroBatch& b) { return b.mb.real_tokens; })
      .def_property_readonly("target_tokens", [](const PyMicroBatch& b) { return b.mb.target_tokens; })
      .def_property_readonly("recompute", [](const PyMicroBatch& b) { return std::string(recompute_name(b.recompute)); },
                             "The activation recompute it runs in: its own, else its replica's mode.")
      .def_property_readonly("est_fwd_ms", [](const PyMicroBatch& b) { return b.est.fwd_ms; },
                             "Estimated forward time per stage, ms.")
      .def_property_readonly("est_bwd_ms", [](const PyMicroBatch& b) { return b.est.bwd_ms; },
                             "Estimated backward time per stage, ms.")
      .def_property_readonly("est_activation_bytes", [](const PyMicroBatch& b) { return b.est.activation_bytes; })
      .def("__len__", [](const PyMicroBatch& b) { return b.mb.sample_ids.size(); })
      .def("__repr__", [](const PyMicroBatch& b) {
        return cat("<MicroBatch id=", b.mb.id, " replica=", b.replica, " samples=", b.mb.sample_ids.size(),
                   " shape=", py::str(shape_tuple(b.mb.shape, b.kind)).cast<std::string>(), ">");
      });

  py::class_<ExecutorProgram>(m, "ExecutorProgram", "The instruction list of one executor (rank).")
      .def_readonly("rank", &ExecutorProgram::rank)
      .def_readonly("device", &ExecutorProgram::device)
      .def_readonly("replica", &ExecutorProgram::replica)
      .def_readonly("stage_replica", &ExecutorProgram::stage_replica)
      .def_readonly("instructions", &ExecutorProgram::instructions);

  py::class_<ReplicaPlan>(m, "ReplicaPlan", "The plan of one data-parallel replica.")
      .def_property_readonly("microbatches", [](const ReplicaPlan& r) {
        ModelKind kind = ModelKind::Gpt;
        for (const MicroBatch& mb : r.microbatches) if (mb.shape.dec_seqlen > 0) kind = ModelKind::T5;
        const int replica = r.executors.empty() ? 0 : r.executors.front().replica;
        return replica_microbatches(r, replica, kind);
      })
      .def_property_readonly("schedule", [](const ReplicaPlan& r) { return std::string(schedule_kind_name(r.schedule)); },
                             "The schedule chosen, e.g. 'wait-free-cyclic' (never 'auto').")
      .def_property_readonly("recompute", [](const ReplicaPlan& r) { return std::string(recompute_name(r.recompute)); })
      .def_readonly("est_iteration_ms", &ReplicaPlan::est_iteration_ms)
      .def_readonly("est_peak_memory_bytes", &ReplicaPlan::est_peak_memory_bytes)
      .def_readonly("executors", &ReplicaPlan::executors);

  py::class_<IterationPlan>(m, "IterationPlan",
                            "The plan of one global batch: micro-batches, schedule, per-rank instructions.")
      .def_readonly("index", &IterationPlan::index)
      .def_readonly("sample_ids", &IterationPlan::sample_ids)
      .def_readonly("truncated_ids", &IterationPlan::truncated_ids)
      .def_readonly("replicas", &IterationPlan::replicas)
      .def_readonly("est_iteration_ms", &IterationPlan::est_iteration_ms,
                    "Estimated iteration time of the slowest replica, ms.")
      .def_readonly("padding_efficiency", &IterationPlan::padding_efficiency,
                    "Real tokens / tokens computed (padded shapes).")
      .def_readwrite("planning_ms", &IterationPlan::planning_ms,
                     "Wall time planning took, ms (writable: zero it to compare plans' bytes).")
      .def_property_readonly("microbatches", [](const IterationPlan& p) {
        const ModelKind kind = infer_kind(p);
        std::vector<PyMicroBatch> out;
        for (std::size_t r = 0; r < p.replicas.size(); ++r) {
          for (PyMicroBatch& mb : replica_microbatches(p.replicas[r], static_cast<int>(r), kind)) {
            out.push_back(std::move(mb));
          }
        }
        return out;
      }, "Every replica's micro-batches, replica 0 first (MicroBatch.replica tells which).")
      .def_property_readonly("schedule", [](const IterationPlan& p) {
        return p.replicas.empty() ? std::string() : std::string(schedule_kind_name(p.replicas.front().schedule));
      }, "The schedule replica 0 runs (ReplicaPlan.schedule per replica).")
      .def_property_readonly("recompute", [](const IterationPlan& p) {
        return p.replicas.empty() ? std::string() : std::string(recompute_name(p.replicas.front().recompute));
      })
      .def_property_readonly("instructions", [](const IterationPlan& p) {
        std::vector<std::vector<Instruction>> out;
        for (int rank = 0; rank < num_ranks(p); ++rank) out.push_back(instructions_of(p, rank));
        return out;
      }, "instructions[rank]: the instruction list of each executor rank (replica * pp + stage).")
      .def("to_json", [](const IterationPlan& p, int indent) { return iteration_to_json(p, infer_kind(p), indent); },
           py::arg("indent") = 2, "The plan's iterations[i] JSON object (docs/plan-format.md); indent < 0: one line.")
      .def("to_bytes", [](const IterationPlan& p) { return py::bytes(encode_iteration(p)); },
           "The binary wire form (what executors fetch from the plan store).")
      .def_static("from_bytes", [](py::handle data) { return decode_iteration(bytes_arg(data)); }, py::arg("data"),
                  "Decodes to_bytes() output; raises dynapipe.ParseError naming the byte offset.")
      .def("__eq__", [](const IterationPlan& a, const IterationPlan& b) {
        return encode_iteration(a) == encode_iteration(b);
      })
      .def("__repr__", [](const IterationPlan& p) {
        std::size_t mbs = 0;
        for (const ReplicaPlan& r : p.replicas) mbs += r.microbatches.size();
        return cat("<IterationPlan index=", p.index, " samples=", p.sample_ids.size(), " microbatches=", mbs,
                   " schedule=", p.replicas.empty() ? std::string_view() : schedule_kind_name(p.replicas.front().schedule),
                   " est_iteration_ms=", p.est_iteration_ms, ">");
      });

  py::class_<ExecutionPlan>(m, "ExecutionPlan", "A whole plan file, as `dynapipe plan --out` writes it.")
      .def_readonly("iterations", &ExecutionPlan::iterations)
      .def_property_readonly("config_json", [](const ExecutionPlan& p) {
        ExecutionPlan only_config;
        only_config.config = p.config;
        return plan_to_json(only_config, -1);
      }, "The plan's JSON without iterations (config and summary), one line.")
      .def("to_json", [](const ExecutionPlan& p, int indent) { return plan_to_json(p, indent); },
           py::arg("indent") = 1)
      .def_static("from_json", [](py::handle text, py::handle where) {
        return plan_from_json(to_str(text, "text"), where.is_none() ? std::string("plan") : to_str(where, "where"));
      }, py::arg("text"), py::arg("where") = py::none(),
      "Parses a plan JSON; raises dynapipe.ParseError naming `where` and the JSON path.");
}

}  // namespace dynapipe::python
