// dynapipe::Error: the one exception type of the project, and DYNAPIPE_CHECK.
//
// Input is validated where it enters (readers, flags, plan decoding, store fetches) and
// a bad value throws Error with a kind and a one-line message of the form
//   "<where>: <what> must be <expected>, got <actual>".
// The CLI maps the kind to an exit code (exit_code()); nothing in between catches and
// continues. Invariants inside the library use DYNAPIPE_CHECK, which is always on and
// throws ErrorKind::Internal. The library never aborts.
//
//   if (pp < 1) throw Error(ErrorKind::InvalidArgument, cat("--pp must be >= 1, got ", pp));
//   DYNAPIPE_CHECK(cut <= n, cat("cut ", cut, " past the end ", n));
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dynapipe/core/strings.h"

namespace dynapipe {

enum class ErrorKind : std::uint8_t {
  InvalidArgument,  // a flag, config field or sample value is wrong           (exit 2)
  NotFound,         // a named file, preset or store key does not exist         (exit 2)
  ParseError,       // a file exists but is malformed                           (exit 2)
  Infeasible,       // valid inputs, but no plan satisfies the constraints      (exit 2)
  Unsupported,      // a valid request this build cannot serve                  (exit 2)
  Timeout,          // a peer or store did not answer within its deadline      (exit 1)
  PeerFailure,      // another executor died or reported an error               (exit 1)
  Internal,         // an invariant broke: a bug in dynapipe                    (exit 1)
};

std::string_view error_kind_name(ErrorKind kind);

// Process exit code for an error of this kind: 2 for bad input or usage, 1 otherwise.
int exit_code(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Whether `e` only rules out the option a search tried (nothing fits that memory rule or
// size, or no schedule applies: Infeasible, Unsupported), so the search keeps the others.
inline bool rules_out_option(const Error& e) {
  return e.kind() == ErrorKind::Infeasible || e.kind() == ErrorKind::Unsupported;
}

namespace detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& message);
}  // namespace detail

}  // namespace dynapipe

// Always-on invariant check; the message expression is evaluated only on failure.
#define DYNAPIPE_CHECK(cond, message)                                              \
  do {                                                                             \
    if (!(cond)) ::dynapipe::detail::check_failed(#cond, __FILE__, __LINE__, (message)); \
  } while (false)
