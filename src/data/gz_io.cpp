#include "data/gz_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "dynapipe/core/error.h"

namespace dynapipe::data_detail {

namespace {
constexpr std::size_t kReadChunkBytes = 1 << 16;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// gzerror() prefixes its message with "<path>: "; ours already starts with the path.
std::string gz_reason(gzFile_s* file, const std::string& path, int* errnum) {
  std::string_view message = gzerror(file, errnum);
  if (*errnum == Z_ERRNO) return std::strerror(errno);
  const std::string prefix = path + ": ";
  if (message.substr(0, prefix.size()) == prefix) message.remove_prefix(prefix.size());
  return std::string(message);
}
}  // namespace

GzLineReader::GzLineReader(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  const auto status = std::filesystem::status(path_, ec);
  if (!std::filesystem::exists(status)) {
    throw Error(ErrorKind::NotFound, cat(path_, ": file must exist, got no such file"));
  }
  if (std::filesystem::is_directory(status)) {
    throw Error(ErrorKind::NotFound, cat(path_, ": path must be a file, got a directory"));
  }
  errno = 0;
  file_.reset(gzopen(path_.c_str(), "rb"));
  if (!file_) {
    throw Error(ErrorKind::NotFound, cat(path_, ": file must be readable, got ",
                                         errno != 0 ? std::strerror(errno) : "open failure"));
  }
  gzbuffer(file_.get(), 1 << 17);
}

bool GzLineReader::fill() {
  if (eof_) return false;
  buffer_.erase(0, pos_);
  pos_ = 0;
  const std::size_t old_size = buffer_.size();
  buffer_.resize(old_size + kReadChunkBytes);
  const int got = gzread(file_.get(), buffer_.data() + old_size, kReadChunkBytes);
  if (got < 0) {
    int errnum = 0;
    const std::string reason = gz_reason(file_.get(), path_, &errnum);
    throw Error(ErrorKind::ParseError, cat(path_, ": gzip stream must be valid, got ", reason));
  }
  buffer_.resize(old_size + static_cast<std::size_t>(got));
  if (got == 0) {
    // zlib reports a stream cut short only through gzerror once reading stops.
    int errnum = 0;
    const std::string reason = gz_reason(file_.get(), path_, &errnum);
    if (errnum != Z_OK && errnum != Z_STREAM_END) {
      throw Error(ErrorKind::ParseError, cat(path_, ": gzip stream must be complete, got ", reason));
    }
    eof_ = true;
    return false;
  }
  return true;
}

bool GzLineReader::next(std::string& line) {
  while (true) {
    const std::size_t newline = buffer_.find('\n', pos_);
    if (newline != std::string::npos) {
      line.assign(buffer_, pos_, newline - pos_);
      pos_ = newline + 1;
      break;
    }
    if (!fill()) {
      if (pos_ >= buffer_.size()) return false;
      line.assign(buffer_, pos_, std::string::npos);
      pos_ = buffer_.size();
      break;
    }
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  ++line_number_;
  return true;
}

void write_text_file(const std::string& path, std::string_view content) {
  const std::string tmp_path = path + ".tmp";
  const bool gzip = ends_with(path, ".gz");
  bool ok = false;
  errno = 0;
  if (gzip) {
    // "wb9": best compression; gzopen writes a header without a timestamp, so the same
    // content always gives the same bytes.
    GzFilePtr file(gzopen(tmp_path.c_str(), "wb9"));
    if (file) {
      ok = true;
      std::size_t done = 0;
      while (ok && done < content.size()) {
        const std::size_t chunk = std::min<std::size_t>(content.size() - done, 1 << 20);
        ok = gzwrite(file.get(), content.data() + done, static_cast<unsigned>(chunk)) ==
             static_cast<int>(chunk);
        done += chunk;
      }
      ok = gzclose(file.release()) == Z_OK && ok;
    }
  } else {
    std::FILE* file = std::fopen(tmp_path.c_str(), "wb");
    if (file) {
      ok = std::fwrite(content.data(), 1, content.size(), file) == content.size();
      ok = std::fclose(file) == 0 && ok;
    }
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp_path, path, ec);
  if (!ok || ec) {
    const std::string reason = ec ? ec.message()
                                  : (errno != 0 ? std::strerror(errno) : "write failure");
    std::filesystem::remove(tmp_path, ec);
    throw Error(ErrorKind::NotFound, cat(path, ": file must be writable, got ", reason));
  }
}

}  // namespace dynapipe::data_detail
