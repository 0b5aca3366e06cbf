// Binary codec of IterationPlan (docs/plan-format.md, "Binary format").
//
// Layout: "DPPL", u16 version, u16 flags (0), then sections, each u8 tag + varint
// length + payload, in a fixed order: the iteration header, then one replica section per
// replica holding four sub-sections (meta, micro-batches, timeline, executors; the last
// one holds a section per executor, so a reader can skip to its own rank).
// Integers are LEB128 varints (signed ones zigzag-mapped), doubles 8-byte IEEE-754, all
// little-endian. Encoding is canonical: decode() accepts only minimal varints, 0/1
// booleans and zero flags, so encode(decode(bytes)) == bytes for every accepted input.
//
// Invariants (decoder): every read is bounds-checked against its section; a count is
// accepted only if the bytes left can hold that many elements, so allocation is bounded
// by the input size; a section must be consumed exactly.
#include "dynapipe/plan/plan_binary.h"

#include <cstring>
#include <limits>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

enum Tag : std::uint8_t {
  kIterationTag = 1,
  kReplicaTag = 2,
  kReplicaMetaTag = 3,
  kMicrobatchesTag = 4,
  kTimelineTag = 5,
  kExecutorsTag = 6,
  kExecutorTag = 7,
};

// Instruction presence mask bits. Part of plan binary v1: never renumber.
enum : std::uint8_t {
  kHasMb = 1,
  kHasStage = 2,
  kHasPeer = 4,
  kHasShape = 8,
  kHasBuffer = 16,
  kHasInputs = 32,
  kHasVersion = 64,
  kKnownMask = 127,
};

// A micro-batch's recompute byte where it runs in its replica's mode (MicroBatch::recompute
// unset); 0-2 are Recompute values.
constexpr std::uint8_t kReplicasMode = 255;

std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
std::int64_t unzigzag(std::uint64_t u) {
  return static_cast<std::int64_t>(u >> 1) ^ -static_cast<std::int64_t>(u & 1);
}

// ---------------------------------------------------------------------------- writer

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(std::uint16_t v) {
    u8(static_cast<std::uint8_t>(v));
    u8(static_cast<std::uint8_t>(v >> 8));
  }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      u8(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    u8(static_cast<std::uint8_t>(v));
  }
  void zz(std::int64_t v) { varint(zigzag(v)); }
  void f64(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(bits >> (8 * i)));
  }
  void string(const std::string& s) {
    varint(s.size());
    out_ += s;
  }
  // Ids as count + zigzag deltas (sorted ids take about a byte each).
  void ids(const std::vector<std::int64_t>& ids) {
    varint(ids.size());
    std::uint64_t previous = 0;
    for (std::int64_t id : ids) {
      zz(static_cast<std::int64_t>(static_cast<std::uint64_t>(id) - previous));
      previous = static_cast<std::uint64_t>(id);
    }
  }
  void section(Tag tag, const Writer& body) {
    u8(tag);
    varint(body.out_.size());
    out_ += body.out_;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

void write_instruction(Writer& w, const Instruction& in) {
  std::uint8_t mask = (in.mb >= 0 ? kHasMb : 0) | (in.stage >= 0 ? kHasStage : 0) |
                      (in.peer >= 0 ? kHasPeer : 0) | (!in.shape.empty() ? kHasShape : 0) |
                      (in.buffer >= 0 ? kHasBuffer : 0) | (!in.inputs.empty() ? kHasInputs : 0) |
                      (in.version >= 0 ? kHasVersion : 0);
  w.u8(static_cast<std::uint8_t>(in.op));
  w.u8(mask);
  if (mask & kHasMb) w.varint(static_cast<std::uint64_t>(in.mb));
  if (mask & kHasStage) w.varint(static_cast<std::uint64_t>(in.stage));
  if (mask & kHasPeer) w.varint(static_cast<std::uint64_t>(in.peer));
  if (mask & kHasShape) {
    w.varint(in.shape.size());
    for (std::int64_t d : in.shape) w.zz(d);
  }
  if (mask & kHasBuffer) w.varint(static_cast<std::uint64_t>(in.buffer));
  if (mask & kHasInputs) {
    w.varint(in.inputs.size());
    for (int id : in.inputs) w.zz(id);
  }
  if (mask & kHasVersion) w.varint(static_cast<std::uint64_t>(in.version));
}

void write_replica(Writer& out, const ReplicaPlan& r) {
  if (!r.estimates.empty() && r.estimates.size() != r.microbatches.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("plan binary: replica estimates must be empty or one per micro-batch (",
                    r.microbatches.size(), "), got ", r.estimates.size()));
  }
  Writer meta;
  meta.string(std::string(schedule_kind_name(r.schedule)));
  meta.u8(static_cast<std::uint8_t>(r.recompute));
  meta.f64(r.est_iteration_ms);
  meta.varint(r.est_peak_memory_bytes.size());
  for (std::int64_t b : r.est_peak_memory_bytes) meta.zz(b);

  Writer mbs;
  mbs.varint(r.microbatches.size());
  for (const MicroBatch& mb : r.microbatches) {
    mbs.ids(mb.sample_ids);
    mbs.varint(mb.rows.size());
    for (const auto& row : mb.rows) mbs.ids(row);
    mbs.zz(mb.shape.batch);
    mbs.zz(mb.shape.seqlen);
    mbs.zz(mb.shape.dec_seqlen);
    mbs.f64(mb.density.enc);
    mbs.f64(mb.density.dec);
    mbs.zz(mb.real_tokens);
    mbs.zz(mb.target_tokens);
    mbs.u8(mb.recompute ? static_cast<std::uint8_t>(*mb.recompute) : kReplicasMode);
  }
  mbs.u8(r.estimates.empty() ? 0 : 1);
  for (const MicroBatchEstimate& e : r.estimates) {
    mbs.varint(e.fwd_ms.size());
    for (double v : e.fwd_ms) mbs.f64(v);
    mbs.varint(e.bwd_ms.size());
    for (double v : e.bwd_ms) mbs.f64(v);
    mbs.varint(e.activation_bytes.size());
    for (std::int64_t v : e.activation_bytes) mbs.zz(v);
  }

  Writer timeline;
  timeline.varint(r.timeline.size());
  for (const TimedOp& t : r.timeline) {
    timeline.zz(t.op.mb);
    timeline.zz(t.op.stage);
    timeline.u8(static_cast<std::uint8_t>(t.op.kind));
    timeline.f64(t.start_ms);
    timeline.f64(t.end_ms);
    timeline.zz(t.device);
  }

  Writer executors;
  executors.varint(r.executors.size());
  for (const ExecutorProgram& p : r.executors) {
    Writer e;
    e.zz(p.rank);
    e.zz(p.device);
    e.zz(p.replica);
    e.varint(p.instructions.size());
    for (const Instruction& in : p.instructions) write_instruction(e, in);
    if (p.stage_replica != 0) e.zz(p.stage_replica);  // optional trailing field; absent = 0
    executors.section(kExecutorTag, e);
  }

  Writer replica;
  replica.section(kReplicaMetaTag, meta);
  replica.section(kMicrobatchesTag, mbs);
  replica.section(kTimelineTag, timeline);
  replica.section(kExecutorsTag, executors);
  out.section(kReplicaTag, replica);
}

// ---------------------------------------------------------------------------- reader

class Reader {
 public:
  Reader(std::string_view data, std::size_t base, const char* section)
      : data_(data), base_(base), section_(section) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::ParseError,
                cat("plan binary: ", section_, " section at byte ", base_ + pos_, ": ", what));
  }
  std::size_t left() const { return data_.size() - pos_; }

  std::uint8_t u8() {
    if (left() < 1) fail("needs 1 more byte, got the end of the section");
    return static_cast<std::uint8_t>(data_[pos_++]);
  }
  std::uint16_t u16() {
    std::uint16_t lo = u8();
    return static_cast<std::uint16_t>(lo | (u8() << 8));
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      std::uint8_t byte = u8();
      if (shift == 63 && byte > 1) fail("a varint must fit in 64 bits, got more");
      v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) {
        if (byte == 0 && shift > 0) fail("a varint must be minimal, got a trailing zero byte");
        return v;
      }
    }
  }
  std::int64_t zz() { return unzigzag(varint()); }
  int zz32() {
    std::int64_t v = zz();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      fail(cat("an int32 value must fit in 32 bits, got ", v));
    }
    return static_cast<int>(v);
  }
  int non_negative32(const char* what) {
    std::uint64_t v = varint();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
      fail(cat(what, " must be in [0, 2^31), got ", v));
    }
    return static_cast<int>(v);
  }
  double f64() {
    if (left() < 8) fail(cat("a double needs 8 bytes, got ", left()));
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 8;
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  // A count of elements of at least `min_bytes` each that the section can still hold.
  std::size_t count(const char* what, std::size_t min_bytes = 1) {
    std::uint64_t n = varint();
    if (n > left() / min_bytes) {
      fail(cat(what, " count must fit in the ", left(), " bytes left, got ", n));
    }
    return static_cast<std::size_t>(n);
  }
  std::string string(const char* what) {
    std::size_t n = count(what);
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::vector<std::int64_t> ids(const char* what) {
    std::size_t n = count(what);
    std::vector<std::int64_t> out;
    out.reserve(n);
    std::uint64_t previous = 0;
    for (std::size_t i = 0; i < n; ++i) {
      previous += static_cast<std::uint64_t>(zz());
      out.push_back(static_cast<std::int64_t>(previous));
    }
    return out;
  }
  bool flag(const char* what) {
    std::uint8_t v = u8();
    if (v > 1) fail(cat(what, " must be 0 or 1, got ", static_cast<int>(v)));
    return v == 1;
  }
  Reader section(Tag tag, const char* name) {
    std::uint8_t got = u8();
    if (got != tag) fail(cat("the next section must be ", name, " (tag ", static_cast<int>(tag), "), got tag ",
                             static_cast<int>(got)));
    std::uint64_t length = varint();
    if (length > left()) fail(cat(name, " section length must fit in the ", left(), " bytes left, got ", length));
    Reader sub(data_.substr(pos_, length), base_ + pos_, name);
    pos_ += length;
    return sub;
  }
  void finish() const {
    if (left() != 0) fail(cat("must end here, got ", left(), " trailing bytes"));
  }

 private:
  std::string_view data_;
  std::size_t pos_ = 0;
  std::size_t base_;
  const char* section_;
};

Instruction read_instruction(Reader& r) {
  Instruction in;
  std::uint8_t op = r.u8();
  if (op >= kNumInstructionOps) r.fail(cat("instruction op must be < ", kNumInstructionOps, ", got ", int{op}));
  in.op = static_cast<InstructionOp>(op);
  std::uint8_t mask = r.u8();
  if (mask & ~kKnownMask) {
    r.fail(cat("instruction field mask must use bits 0-6 only, got ", int{mask}));
  }
  if (mask & kHasMb) in.mb = r.non_negative32("mb");
  if (mask & kHasStage) in.stage = r.non_negative32("stage");
  if (mask & kHasPeer) in.peer = r.non_negative32("peer");
  if (mask & kHasShape) {
    std::size_t n = r.count("shape");
    if (n == 0) r.fail("a present shape must have dims, got 0");
    for (std::size_t i = 0; i < n; ++i) in.shape.push_back(r.zz());
  }
  if (mask & kHasBuffer) in.buffer = r.non_negative32("buffer");
  if (mask & kHasInputs) {
    std::size_t n = r.count("inputs");
    if (n == 0) r.fail("present inputs must be non-empty, got 0");
    for (std::size_t i = 0; i < n; ++i) in.inputs.push_back(r.zz32());
  }
  if (mask & kHasVersion) in.version = r.non_negative32("version");
  return in;
}

ReplicaPlan read_replica(Reader& parent) {
  Reader replica = parent.section(kReplicaTag, "replica");
  ReplicaPlan r;

  Reader meta = replica.section(kReplicaMetaTag, "replica meta");
  const std::string schedule = meta.string("schedule");
  const std::optional<ScheduleKind> kind = parse_schedule_kind(schedule);
  if (!kind || *kind == ScheduleKind::Auto) {
    meta.fail(cat("schedule must name a schedule (gpipe, 1f1b, ...), got \"", schedule, "\""));
  }
  r.schedule = *kind;
  std::uint8_t recompute = meta.u8();
  if (recompute > 2) meta.fail(cat("recompute must be 0, 1 or 2, got ", int{recompute}));
  r.recompute = static_cast<Recompute>(recompute);
  r.est_iteration_ms = meta.f64();
  std::size_t peaks = meta.count("est_peak_memory_bytes");
  for (std::size_t i = 0; i < peaks; ++i) r.est_peak_memory_bytes.push_back(meta.zz());
  meta.finish();

  Reader mbs = replica.section(kMicrobatchesTag, "micro-batches");
  std::size_t n = mbs.count("micro-batch", 2 * 8 + 8);
  for (std::size_t i = 0; i < n; ++i) {
    MicroBatch mb;
    mb.id = static_cast<int>(i);
    mb.sample_ids = mbs.ids("sample_ids");
    std::size_t rows = mbs.count("rows");
    for (std::size_t k = 0; k < rows; ++k) mb.rows.push_back(mbs.ids("row"));
    mb.shape.batch = mbs.zz();
    mb.shape.seqlen = mbs.zz();
    mb.shape.dec_seqlen = mbs.zz();
    mb.density.enc = mbs.f64();
    mb.density.dec = mbs.f64();
    mb.real_tokens = mbs.zz();
    mb.target_tokens = mbs.zz();
    const std::uint8_t mode = mbs.u8();
    if (mode != kReplicasMode) {
      if (mode > 2) mbs.fail(cat("micro-batch recompute must be 0, 1, 2 or 255, got ", int{mode}));
      mb.recompute = static_cast<Recompute>(mode);
    }
    r.microbatches.push_back(std::move(mb));
  }
  if (mbs.flag("has_estimates")) {
    for (std::size_t i = 0; i < n; ++i) {
      MicroBatchEstimate e;
      std::size_t k = mbs.count("est_fwd_ms", 8);
      for (std::size_t j = 0; j < k; ++j) e.fwd_ms.push_back(mbs.f64());
      k = mbs.count("est_bwd_ms", 8);
      for (std::size_t j = 0; j < k; ++j) e.bwd_ms.push_back(mbs.f64());
      k = mbs.count("est_activation_bytes");
      for (std::size_t j = 0; j < k; ++j) e.activation_bytes.push_back(mbs.zz());
      r.estimates.push_back(std::move(e));
    }
  }
  mbs.finish();

  Reader timeline = replica.section(kTimelineTag, "timeline");
  std::size_t ops = timeline.count("timeline op", 2 * 8 + 4);
  for (std::size_t i = 0; i < ops; ++i) {
    TimedOp t;
    t.op.mb = timeline.zz32();
    t.op.stage = timeline.zz32();
    std::uint8_t kind = timeline.u8();
    if (kind > 3) timeline.fail(cat("timeline op kind must be 0-3 (F, B, I, W), got ", int{kind}));
    t.op.kind = static_cast<OpKind>(kind);
    t.start_ms = timeline.f64();
    t.end_ms = timeline.f64();
    t.device = timeline.zz32();
    r.timeline.push_back(t);
  }
  timeline.finish();

  Reader executors = replica.section(kExecutorsTag, "executors");
  std::size_t programs = executors.count("executor", 2);
  for (std::size_t i = 0; i < programs; ++i) {
    Reader e = executors.section(kExecutorTag, "executor");
    ExecutorProgram p;
    p.rank = e.zz32();
    p.device = e.zz32();
    p.replica = e.zz32();
    std::size_t count = e.count("instruction", 2);
    p.instructions.reserve(count);
    for (std::size_t k = 0; k < count; ++k) p.instructions.push_back(read_instruction(e));
    if (e.left() > 0) {  // written only when non-zero, so the encoding stays canonical
      p.stage_replica = e.zz32();
      if (p.stage_replica < 1) {
        e.fail(cat("stage_replica, when present, must be >= 1, got ", p.stage_replica));
      }
    }
    e.finish();
    r.executors.push_back(std::move(p));
  }
  executors.finish();
  replica.finish();
  return r;
}

}  // namespace

std::string encode_iteration(const IterationPlan& it) {
  Writer out;
  for (char c : kPlanBinaryMagic) out.u8(static_cast<std::uint8_t>(c));
  out.u16(kPlanBinaryVersion);
  out.u16(0);  // flags, reserved
  Writer header;
  header.zz(it.index);
  header.f64(it.est_iteration_ms);
  header.f64(it.padding_efficiency);
  header.f64(it.planning_ms);
  header.ids(it.sample_ids);
  header.ids(it.truncated_ids);
  header.varint(it.replicas.size());
  out.section(kIterationTag, header);
  for (const ReplicaPlan& r : it.replicas) write_replica(out, r);
  return out.take();
}

IterationPlan decode_iteration(std::string_view bytes) {
  Reader r(bytes, 0, "file header");
  for (char c : kPlanBinaryMagic) {
    if (r.left() == 0 || r.u8() != static_cast<std::uint8_t>(c)) {
      throw Error(ErrorKind::ParseError, "plan binary: the data must start with the magic \"DPPL\", got something else");
    }
  }
  std::uint16_t version = r.u16();
  if (version != kPlanBinaryVersion) r.fail(cat("version must be ", kPlanBinaryVersion, ", got ", version));
  std::uint16_t flags = r.u16();
  if (flags != 0) r.fail(cat("flags must be 0, got ", flags));
  IterationPlan it;
  Reader header = r.section(kIterationTag, "iteration");
  it.index = header.zz();
  it.est_iteration_ms = header.f64();
  it.padding_efficiency = header.f64();
  it.planning_ms = header.f64();
  it.sample_ids = header.ids("sample_ids");
  it.truncated_ids = header.ids("truncated_ids");
  std::uint64_t replicas = header.varint();
  header.finish();
  // A replica section takes at least 10 bytes (its tag and length, four empty sub-sections).
  if (replicas > r.left() / 10) r.fail(cat("replica count must fit in the ", r.left(), " bytes left, got ", replicas));
  for (std::uint64_t i = 0; i < replicas; ++i) it.replicas.push_back(read_replica(r));
  r.finish();
  return it;
}

}  // namespace dynapipe
