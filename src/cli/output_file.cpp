#include "cli/output_file.h"

#include <cstdio>
#include <fstream>

#include "dynapipe/core/error.h"

namespace dynapipe::cli {

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error(ErrorKind::InvalidArgument, cat(path, ": cannot open for writing"));
    }
    out << contents;
    if (!out.flush()) {
      throw Error(ErrorKind::InvalidArgument, cat(path, ": write failed"));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw Error(ErrorKind::InvalidArgument, cat(path, ": cannot be written (rename failed)"));
  }
}

}  // namespace dynapipe::cli
