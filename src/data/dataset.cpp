#include "dynapipe/data/dataset.h"

#include <algorithm>

#include "data/gz_io.h"
#include "dynapipe/core/error.h"
#include "dynapipe/core/json_reader.h"

namespace dynapipe {

namespace {

// Lengths past int64 saturate: truncation shortens them anyway (docs/data.md).
std::int64_t positive_length(const JsonValue& value) {
  return static_cast<std::int64_t>(std::min<std::uint64_t>(value.uint64(1), JsonValue::kMaxInt));
}

std::string non_empty_string(const JsonValue& value) {
  if (!value.is_string() || value.string().empty()) value.fail("a non-empty string");
  return value.string();
}

}  // namespace

// Accumulates validated samples; shared by load() and from_lengths() so that both
// apply the same id, task and truncation rules.
class DatasetBuilder {
 public:
  DatasetBuilder(const TruncationLimits& limits, ErrorKind error_kind, std::string origin_noun)
      : error_kind_(error_kind), origin_noun_(std::move(origin_noun)) {
    limits.validate();
    dataset_.limits_ = limits;
  }

  // `origin` is the line number or sample index used in messages; `where` prefixes them.
  // `default_id` tells the duplicate message that the id was not written explicitly.
  void add(SampleId id, bool default_id, std::int64_t origin, const std::string& where,
           std::int32_t task, std::int64_t input_len, std::int64_t target_len,
           const std::string* input_text = nullptr, const std::string* target_text = nullptr) {
    const auto [it, inserted] = dataset_.index_.try_emplace(id, dataset_.samples_.size());
    if (!inserted) {
      throw Error(error_kind_,
                  cat(where, ": id must be unique, got ", id,
                      default_id ? " (the default id: 0-based line number)" : "",
                      ", already the id of ", origin_noun_, " ",
                      origins_[it->second]));
    }
    const TruncatedLengths t = truncate_lengths(input_len, target_len, dataset_.limits_);
    Sample sample;
    sample.id = id;
    sample.input_len = static_cast<std::int32_t>(t.input_len);
    sample.target_len = static_cast<std::int32_t>(t.target_len);
    sample.task = task;
    dataset_.samples_.push_back(sample);
    origins_.push_back(origin);
    if (t.truncated) dataset_.truncated_ids_.push_back(id);
    if (input_text != nullptr) {
      // Text storage starts at the first text sample; earlier samples get empty entries.
      dataset_.text_.resize(dataset_.samples_.size() - 1);
      dataset_.text_.push_back({input_text->substr(0, static_cast<std::size_t>(t.input_len)),
                                target_text->substr(0, static_cast<std::size_t>(t.target_len))});
    } else if (!dataset_.text_.empty()) {
      dataset_.text_.emplace_back();
    }
  }

  std::int32_t task_index(const std::string& name) {
    const auto [it, inserted] =
        task_ids_.try_emplace(name, static_cast<std::int32_t>(dataset_.task_names_.size()));
    if (inserted) dataset_.task_names_.push_back(name);
    return it->second;
  }

  std::vector<std::string>& task_names() { return dataset_.task_names_; }
  std::size_t size() const { return dataset_.samples_.size(); }

  Dataset finish() {
    if (!dataset_.text_.empty()) dataset_.text_.resize(dataset_.samples_.size());
    return std::move(dataset_);
  }

 private:
  ErrorKind error_kind_;
  std::string origin_noun_;
  Dataset dataset_;
  std::vector<std::int64_t> origins_;  // parallel to samples: line number or index
  std::unordered_map<std::string, std::int32_t> task_ids_;
};

Dataset Dataset::load(const std::string& path, const TruncationLimits& limits) {
  DatasetBuilder builder(limits, ErrorKind::ParseError, "line");
  data_detail::GzLineReader reader(path);
  std::string text;
  while (reader.next(text)) {
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    const std::int64_t line_number = reader.line_number();
    // Plain appends, not cat(): a string stream per line was a quarter of the read.
    const std::string where = path + ":" + std::to_string(line_number);
    const JsonDocument document(text, where, "line");
    const JsonValue line = document.root();
    line.expect_object();

    const bool default_id = !line.has("id");
    const SampleId id = default_id ? line_number - 1 : line["id"].integer(0);
    const std::int32_t task = line.has("task") ? builder.task_index(line["task"].string()) : -1;

    const bool has_lengths = line.has("input_len") || line.has("target_len");
    const bool has_text = line.has("input") || line.has("target");
    if (has_lengths && has_text) {
      throw Error(ErrorKind::ParseError,
                  cat(where, ": sample must have either lengths (\"input_len\", \"target_len\") "
                             "or text (\"input\", \"target\"), got both"));
    }
    if (!has_lengths && !has_text) {
      throw Error(ErrorKind::ParseError,
                  cat(where, ": sample must have \"input_len\" and \"target_len\" (lengths) or "
                             "\"input\" and \"target\" (text), got neither"));
    }
    const char* first = has_text ? "input" : "input_len";
    const char* second = has_text ? "target" : "target_len";
    if (!line.has(first)) line.fail_field(first, cat("present with ", second));
    if (!line.has(second)) line.fail_field(second, cat("present with ", first));
    if (has_text) {
      const std::string input = non_empty_string(line["input"]);
      const std::string target = non_empty_string(line["target"]);
      builder.add(id, default_id, line_number, where, task,
                  static_cast<std::int64_t>(input.size()), static_cast<std::int64_t>(target.size()),
                  &input, &target);
    } else {
      const std::int64_t input_len = positive_length(line["input_len"]);
      const std::int64_t target_len = positive_length(line["target_len"]);
      builder.add(id, default_id, line_number, where, task, input_len, target_len);
    }
  }
  if (builder.size() == 0) {
    throw Error(ErrorKind::ParseError,
                cat(path, ": file must contain at least one sample, got none"));
  }
  return builder.finish();
}

Dataset Dataset::from_lengths(std::vector<Sample> samples, std::vector<std::string> task_names,
                              const TruncationLimits& limits) {
  DatasetBuilder builder(limits, ErrorKind::InvalidArgument, "sample");
  builder.task_names() = std::move(task_names);
  const auto num_tasks = static_cast<std::int64_t>(builder.task_names().size());
  if (samples.empty()) {
    throw Error(ErrorKind::InvalidArgument, "samples must contain at least one sample, got none");
  }
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const std::string where = cat("sample ", i);
    if (s.task < -1 || s.task >= num_tasks) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where, ": task must be -1 or in [0, ", num_tasks, "), got ", s.task));
    }
    if (s.input_len < 1 || s.target_len < 1) {
      throw Error(ErrorKind::InvalidArgument,
                  cat(where, ": input_len and target_len must be >= 1, got ", s.input_len,
                      " and ", s.target_len));
    }
    builder.add(s.id, false, static_cast<std::int64_t>(i), where, s.task, s.input_len,
                s.target_len);
  }
  return builder.finish();
}

const std::string& Dataset::task_name(std::int32_t task) const {
  static const std::string kNoTask;
  if (task < 0 || task >= static_cast<std::int32_t>(task_names_.size())) return kNoTask;
  return task_names_[static_cast<std::size_t>(task)];
}

std::size_t Dataset::index_of(SampleId id) const {
  const auto it = index_.find(id);
  if (it == index_.end()) {
    throw Error(ErrorKind::NotFound, cat("dataset: sample id must be in the dataset, got ", id));
  }
  return it->second;
}

const Sample& Dataset::sample(SampleId id) const { return samples_[index_of(id)]; }

bool Dataset::is_text(SampleId id) const {
  const std::size_t i = index_of(id);
  return !text_.empty() && !text_[i].input.empty();
}

SampleTokens Dataset::tokens(SampleId id) const {
  const std::size_t i = index_of(id);
  if (!text_.empty() && !text_[i].input.empty()) {
    return {byte_tokenize(text_[i].input), byte_tokenize(text_[i].target)};
  }
  return synthetic_tokens(samples_[i]);
}

namespace {
// splitmix64: a well-mixed, platform-independent hash of the id.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

SampleTokens synthetic_tokens(const Sample& sample) {
  // Odd steps are coprime with 256, so every progression visits all 256 byte tokens.
  const std::int64_t step = sample.task >= 0 ? 2 * (sample.task % 64) + 1 : 1;
  const auto start = static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(sample.id)) % 256);
  auto token_at = [&](std::int64_t position) {
    return kByteTokenOffset + (start + step * position) % 256;
  };
  SampleTokens tokens;
  tokens.input.resize(static_cast<std::size_t>(sample.input_len));
  tokens.target.resize(static_cast<std::size_t>(sample.target_len));
  for (std::int64_t p = 0; p < sample.input_len; ++p) tokens.input[p] = token_at(p);
  for (std::int64_t p = 0; p < sample.target_len; ++p) {
    tokens.target[p] = token_at(sample.input_len + p);
  }
  return tokens;
}

}  // namespace dynapipe
