#include "dynapipe/core/error.h"

namespace dynapipe {

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::NotFound: return "not found";
    case ErrorKind::ParseError: return "parse error";
    case ErrorKind::Infeasible: return "infeasible";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Timeout: return "timeout";
    case ErrorKind::PeerFailure: return "peer failure";
    case ErrorKind::Internal: return "internal error";
  }
  return "unknown error";
}

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument:
    case ErrorKind::NotFound:
    case ErrorKind::ParseError:
    case ErrorKind::Infeasible:
    case ErrorKind::Unsupported:
      return 2;
    case ErrorKind::Timeout:
    case ErrorKind::PeerFailure:
    case ErrorKind::Internal:
      return 1;
  }
  return 1;
}

namespace detail {
void check_failed(const char* condition, const char* file, int line, const std::string& message) {
  throw Error(ErrorKind::Internal,
              cat("internal check failed: ", message, " (", condition, " at ", file, ":", line, ")"));
}
}  // namespace detail

}  // namespace dynapipe
