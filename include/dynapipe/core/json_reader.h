// The one reader of JSON input (plans, profiles, model files, sample lines): typed access
// where every error is one ParseError naming the file and the JSON path of the value,
//   "plan.json: iterations[0].replicas[0].executors[1].instructions[5].shape must be an
//    array of integers >= 1, got \"x\"".
// Unknown fields: a format that rejects them calls only_fields() on each object it reads
// (model files, profiles); the others ignore them (docs/errors.md, "JSON input").
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dynapipe {

class JsonValue;

// A parsed document. A syntax error, or a number no type can hold (`1e999`), is a
// ParseError naming `where` and the path it was found at, never an exception of the
// JSON library. `root_name` names the whole document in messages.
class JsonDocument {
 public:
  JsonDocument(std::string_view text, std::string where, std::string root_name = "the document");
  ~JsonDocument();
  JsonDocument(const JsonDocument&) = delete;
  JsonDocument& operator=(const JsonDocument&) = delete;

  JsonValue root() const;

 private:
  struct Tree;
  std::unique_ptr<Tree> tree_;
};

// One value of a JsonDocument and its path; valid while the document lives. Every getter
// throws ParseError "<where>: <path> must be <expected>, got <value>" when the value does
// not fit.
class JsonValue {
 public:
  static constexpr std::int64_t kMinInt = std::numeric_limits<std::int64_t>::min();
  static constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();

  // Objects. operator[] reads a required field ("x must be present, got nothing"); an
  // optional field is read as `if (v.has("x")) ... v["x"]`.
  bool has(std::string_view key) const;
  JsonValue operator[](std::string_view key) const;
  void expect_object() const;
  // The unknown-field policy of strict formats: a key not in `known` is an error that
  // lists the known ones (a misspelt optional field would otherwise be a silent default).
  void only_fields(std::initializer_list<std::string_view> known) const;

  // Arrays.
  std::size_t size() const;  // fails unless an array
  JsonValue operator[](std::size_t index) const;
  template <typename T, typename Read>
  std::vector<T> list(Read read) const {
    const std::size_t n = size();
    std::vector<T> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(read((*this)[i]));
    return out;
  }

  // Scalars, with inclusive ranges: "an integer >= 1", "an integer in [1, 8]", "1".
  std::string string() const;
  std::int64_t integer(std::int64_t lo = kMinInt, std::int64_t hi = kMaxInt) const;
  int int32(int lo = 0, int hi = std::numeric_limits<int>::max()) const;
  std::uint64_t uint64(std::uint64_t lo = 0) const;  // all of [lo, 2^64)
  double number(double lo = -std::numeric_limits<double>::infinity()) const;  // finite
  std::vector<std::int64_t> integers(std::int64_t lo = kMinInt) const;
  std::vector<double> numbers(double lo = -std::numeric_limits<double>::infinity()) const;

  bool is_string() const;
  const std::string& path() const { return path_; }

  // "<where>: <path> must be <expected>, got <this value>".
  [[noreturn]] void fail(std::string_view expected) const;
  // The same for field `key` of this object ("got nothing" when it is absent).
  [[noreturn]] void fail_field(std::string_view key, std::string_view expected) const;

 private:
  friend class JsonDocument;
  // `node` is the JSON library's value, opaque here so that its type stays out of headers.
  JsonValue(const void* node, std::string path, const std::string* where, const std::string* root_name)
      : node_(node), path_(std::move(path)), where_(where), root_name_(root_name) {}
  bool is_object() const;
  std::string shown() const;  // the value as written, cut to 40 characters
  std::string child_path(std::string_view key) const;
  [[noreturn]] void fail_at(const std::string& path, std::string_view expected, const std::string& got) const;

  const void* node_;
  std::string path_;
  const std::string* where_;
  const std::string* root_name_;
};

}  // namespace dynapipe
