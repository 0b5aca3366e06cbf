// JsonDocument / JsonValue over nlohmann::json (include/dynapipe/core/json_reader.h).
#include "dynapipe/core/json_reader.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dynapipe/core/error.h"
#include "dynapipe/core/strings.h"

namespace dynapipe {
namespace {

using Json = nlohmann::json;

constexpr std::size_t kMaxShownChars = 40;

const Json& json_of(const void* node) { return *static_cast<const Json*>(node); }

// Appends `value` as compact JSON (dump(-1)'s text) to `out`, stopping once `out` is past
// `limit`: a value shown in an error may be huge or nested thousands deep, which a whole
// dump() would walk (recursively: a deep enough file overflowed the stack).
void append_shown(const Json& value, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (value.is_array()) {
    out += '[';
    for (std::size_t i = 0; i < value.size() && out.size() <= limit; ++i) {
      if (i > 0) out += ',';
      append_shown(value[i], out, limit);
    }
    out += ']';
  } else if (value.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end() && out.size() <= limit; ++it) {
      if (!first) out += ',';
      first = false;
      out += Json(it.key()).dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
      out += ':';
      append_shown(it.value(), out, limit);
    }
    out += '}';
  } else {
    out += value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
  }
}

std::string shown_json(const Json& value) {
  std::string text;
  append_shown(value, text, kMaxShownChars);
  if (text.size() > kMaxShownChars) text = text.substr(0, kMaxShownChars) + "...";
  return text;
}

// "an integer", "an integer >= 1", "an integer <= 9", "an integer in [1, 8]", or "1".
std::string integer_text(std::int64_t lo, std::int64_t hi) {
  if (lo == hi) return cat(lo);
  const bool has_lo = lo != JsonValue::kMinInt;
  const bool has_hi = hi != JsonValue::kMaxInt;
  if (has_lo && has_hi) return cat("an integer in [", lo, ", ", hi, "]");
  if (has_lo) return cat("an integer >= ", lo);
  if (has_hi) return cat("an integer <= ", hi);
  return "an integer";
}

std::string number_text(double lo) {
  return std::isinf(lo) ? std::string("a finite number") : cat("a finite number >= ", lo);
}

// Where a parse failed, for its message: the JSON path of the value being read. Found by
// parsing a second time with a callback that follows keys and array indices (errors are
// rare; the first parse pays nothing for this).
class PathTracker {
 public:
  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: frames_.push_back({false, 0, ""}); break;
      case Json::parse_event_t::array_start: frames_.push_back({true, 0, ""}); break;
      case Json::parse_event_t::key: frames_.back().key = parsed.get<std::string>(); break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        element_done();
        break;
      case Json::parse_event_t::value: element_done(); break;
    }
    return true;
  }

  std::string path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.array) {
        out += cat("[", f.index, "]");
      } else if (!f.key.empty()) {
        out += out.empty() ? f.key : "." + f.key;
      }
    }
    return out;
  }

 private:
  struct Frame {
    bool array;
    std::size_t index;  // array: elements read so far (the index of the one being read)
    std::string key;    // object: the key whose value is being read; empty between values
  };
  // A value was read whole: the next failure is past it, at the next index or key.
  void element_done() {
    if (frames_.empty()) return;
    Frame& top = frames_.back();
    if (top.array) {
      ++top.index;
    } else {
      top.key.clear();
    }
  }
  std::vector<Frame> frames_;
};

// nlohmann's message without its "[json.exception.parse_error.101] " tag.
std::string reason(const Json::exception& e) {
  std::string what = e.what();
  const std::size_t tag_end = what.find("] ");
  return tag_end == std::string::npos ? what : what.substr(tag_end + 2);
}

[[noreturn]] void throw_parse_error(std::string_view text, const Json::exception& first, const std::string& where,
                                    const std::string& root_name) {
  std::string path;
  auto tracker = std::make_shared<PathTracker>();
  try {
    const Json unused = Json::parse(text.begin(), text.end(), [tracker](int depth, Json::parse_event_t event,
                                                                         Json& parsed) {
      return (*tracker)(depth, event, parsed);
    });
  } catch (const Json::exception&) {
    path = tracker->path();
  }
  const std::string at = path.empty() ? root_name : path;
  // out_of_range 406: "number overflow parsing '1e999'" (a literal no double can hold).
  const std::string message = reason(first);
  const std::size_t quote = message.find('\'');
  if (first.id == 406 && quote != std::string::npos) {
    throw Error(ErrorKind::ParseError, cat(where, ": ", at, " must be a number a double can hold, got ",
                                           message.substr(quote + 1, message.size() - quote - 2)));
  }
  throw Error(ErrorKind::ParseError, cat(where, ": ", at, " must be valid JSON, got ", message));
}

}  // namespace

struct JsonDocument::Tree {
  Json value;
  std::string where;
  std::string root_name;
};

JsonDocument::JsonDocument(std::string_view text, std::string where, std::string root_name)
    : tree_(std::make_unique<Tree>()) {
  tree_->where = std::move(where);
  tree_->root_name = std::move(root_name);
  try {
    tree_->value = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw_parse_error(text, e, tree_->where, tree_->root_name);
  }
}

JsonDocument::~JsonDocument() = default;

JsonValue JsonDocument::root() const { return JsonValue(&tree_->value, "", &tree_->where, &tree_->root_name); }

bool JsonValue::has(std::string_view key) const {
  const Json& v = json_of(node_);
  return v.is_object() && v.find(key) != v.end();
}

JsonValue JsonValue::operator[](std::string_view key) const {
  expect_object();
  const Json& v = json_of(node_);
  const auto it = v.find(key);
  std::string path = child_path(key);
  if (it == v.end()) fail_at(path, "present", "nothing");
  return JsonValue(&*it, std::move(path), where_, root_name_);
}

void JsonValue::expect_object() const {
  if (!is_object()) fail("an object");
}

void JsonValue::only_fields(std::initializer_list<std::string_view> known) const {
  expect_object();
  for (const auto& item : json_of(node_).items()) {
    if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
      fail_at(child_path(item.key()), cat("absent (not a field here; the fields are ", join(known, ", "), ")"),
              shown_json(item.value()));
    }
  }
}

std::size_t JsonValue::size() const {
  const Json& v = json_of(node_);
  if (!v.is_array()) fail("an array");
  return v.size();
}

JsonValue JsonValue::operator[](std::size_t index) const {
  std::string path = path_ + "[" + std::to_string(index) + "]";
  if (index >= size()) fail_at(path, "present", "nothing");
  return JsonValue(&json_of(node_)[index], std::move(path), where_, root_name_);
}

std::string JsonValue::string() const {
  const Json& v = json_of(node_);
  if (!v.is_string()) fail("a string");
  return v.get<std::string>();
}

std::int64_t JsonValue::integer(std::int64_t lo, std::int64_t hi) const {
  const Json& v = json_of(node_);
  const bool fits = v.is_number_integer() &&
                    !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxInt));
  if (!fits) fail(integer_text(lo, hi));
  const auto value = v.get<std::int64_t>();
  if (value < lo || value > hi) fail(integer_text(lo, hi));
  return value;
}

int JsonValue::int32(int lo, int hi) const { return static_cast<int>(integer(lo, hi)); }

std::uint64_t JsonValue::uint64(std::uint64_t lo) const {
  const Json& v = json_of(node_);
  const bool fits = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!fits || v.get<std::uint64_t>() < lo) fail(cat("an integer >= ", lo));
  return v.get<std::uint64_t>();
}

double JsonValue::number(double lo) const {
  const Json& v = json_of(node_);
  if (!v.is_number()) fail(number_text(lo));
  const auto value = v.get<double>();
  if (!std::isfinite(value) || value < lo) fail(number_text(lo));
  return value;
}

std::vector<std::int64_t> JsonValue::integers(std::int64_t lo) const {
  if (!json_of(node_).is_array()) {
    fail(cat("an array of integers", lo == kMinInt ? std::string() : cat(" >= ", lo)));
  }
  return list<std::int64_t>([lo](const JsonValue& item) { return item.integer(lo); });
}

std::vector<double> JsonValue::numbers(double lo) const {
  if (!json_of(node_).is_array()) {
    fail(cat("an array of finite numbers", std::isinf(lo) ? std::string() : cat(" >= ", lo)));
  }
  return list<double>([lo](const JsonValue& item) { return item.number(lo); });
}

bool JsonValue::is_object() const { return json_of(node_).is_object(); }
bool JsonValue::is_string() const { return json_of(node_).is_string(); }
std::string JsonValue::shown() const { return shown_json(json_of(node_)); }

void JsonValue::fail(std::string_view expected) const { fail_at(path_, expected, shown()); }

void JsonValue::fail_field(std::string_view key, std::string_view expected) const {
  const Json& v = json_of(node_);
  const auto it = v.is_object() ? v.find(key) : v.end();
  fail_at(child_path(key), expected, v.is_object() && it != v.end() ? shown_json(*it) : "nothing");
}

std::string JsonValue::child_path(std::string_view key) const {
  std::string path = path_;  // plain appends: this runs for every value read
  if (!path.empty()) path += '.';
  path += key;
  return path;
}

void JsonValue::fail_at(const std::string& path, std::string_view expected, const std::string& got) const {
  throw Error(ErrorKind::ParseError, cat(*where_, ": ", path.empty() ? *root_name_ : path, " must be ",
                                         expected, ", got ", got));
}

}  // namespace dynapipe
