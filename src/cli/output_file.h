// Writing output files all at once: a temporary file renamed into place, so a failed
// command never leaves a half-written file.
#pragma once

#include <string>

namespace dynapipe::cli {

// Throws InvalidArgument naming the path if it cannot be written.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace dynapipe::cli
