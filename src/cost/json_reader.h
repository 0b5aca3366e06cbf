// JsonReader: typed, path-aware access to a parsed JSON value, so that every ParseError
// names the file and the JSON path ("profile.json: layers[2].points.none[0].fwd_ms must
// be a number >= 0, got \"x\""). Private to cost/.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dynapipe/core/error.h"

namespace dynapipe::detail {

class JsonReader {
 public:
  JsonReader(const nlohmann::json& value, std::string where, std::string path)
      : value_(value), where_(std::move(where)), path_(std::move(path)) {}

  // Parses `text`; a syntax error or a number no type can hold (nlohmann's out_of_range
  // 406, found by profile_fuzz) becomes ParseError naming `where`.
  static nlohmann::json parse(const std::string& text, const std::string& where) {
    try {
      return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorKind::ParseError, cat(where, ": not valid JSON (", e.what(), ")"));
    }
  }

  const nlohmann::json& value() const { return value_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& expected) const {
    throw Error(ErrorKind::ParseError,
                cat(where_, ": ", path_.empty() ? "the document" : path_, " must be ", expected,
                    ", got ", shown(value_)));
  }
  [[noreturn]] void fail_field(const std::string& key, const std::string& expected) const {
    throw Error(ErrorKind::ParseError,
                cat(where_, ": ", child_path(key), " must be ", expected, ", got ",
                    value_.contains(key) ? shown(value_.at(key)) : std::string("nothing")));
  }

  void expect_object() const {
    if (!value_.is_object()) fail("an object");
  }
  void expect_array() const {
    if (!value_.is_array()) fail("an array");
  }
  bool has(const std::string& key) const { return value_.is_object() && value_.contains(key); }

  JsonReader at(const std::string& key) const {
    expect_object();
    if (!value_.contains(key)) fail_field(key, "present");
    return JsonReader(value_.at(key), where_, child_path(key));
  }
  JsonReader at(std::size_t index) const {
    return JsonReader(value_.at(index), where_, cat(path_, "[", index, "]"));
  }
  std::size_t size() const { return value_.size(); }

  // Every key must be one of `known`: a misspelt field is an error, not a silent default.
  void expect_keys(const std::vector<std::string>& known) const {
    expect_object();
    for (const auto& item : value_.items()) {
      bool found = false;
      for (const auto& k : known) found = found || k == item.key();
      if (!found) {
        throw Error(ErrorKind::ParseError,
                    cat(where_, ": ", child_path(item.key()), " is not a known field (expected one of ",
                        join(known, ", "), ")"));
      }
    }
  }

  std::string as_string() const {
    if (!value_.is_string()) fail("a string");
    return value_.get<std::string>();
  }
  std::int64_t as_int(std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                      std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    if (!value_.is_number_integer()) fail(range_text("an integer", lo, hi));
    const std::int64_t v = value_.get<std::int64_t>();
    if (v < lo || v > hi) fail(range_text("an integer", lo, hi));
    return v;
  }
  double as_double(double lo = -std::numeric_limits<double>::infinity()) const {
    if (!value_.is_number()) fail(cat("a number >= ", lo));
    const double v = value_.get<double>();
    if (!(v >= lo) || v == std::numeric_limits<double>::infinity()) fail(cat("a finite number >= ", lo));
    return v;
  }

 private:
  std::string child_path(const std::string& key) const {
    return path_.empty() ? key : cat(path_, ".", key);
  }
  static std::string shown(const nlohmann::json& v) {
    std::string text = v.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return text;
  }
  static std::string range_text(const char* what, std::int64_t lo, std::int64_t hi) {
    if (hi == std::numeric_limits<std::int64_t>::max()) {
      if (lo == std::numeric_limits<std::int64_t>::min()) return what;
      return cat(what, " >= ", lo);
    }
    return cat(what, " in [", lo, ", ", hi, "]");
  }

  const nlohmann::json& value_;
  std::string where_;
  std::string path_;
};

}  // namespace dynapipe::detail
