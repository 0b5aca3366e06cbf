// Private to data/: line reading and whole-file writing through zlib, which reads
// gzip and plain files alike (gzip is detected by its magic bytes, not the name).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace dynapipe::data_detail {

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads a (possibly gzip-compressed) text file line by line. Lines end at '\n'; a
// trailing '\r' is removed; the last line may lack its '\n'.
// Throws Error(NotFound) if the file is missing or unreadable, Error(ParseError) if a
// gzip stream is corrupt or cut short.
class GzLineReader {
 public:
  explicit GzLineReader(std::string path);
  // Sets `line` to the next line and returns true, or returns false at the end.
  bool next(std::string& line);
  // 1-based number of the line last returned by next().
  std::int64_t line_number() const { return line_number_; }

 private:
  bool fill();

  std::string path_;
  GzFilePtr file_;
  std::string buffer_;
  std::size_t pos_ = 0;
  bool eof_ = false;
  std::int64_t line_number_ = 0;
};

// Writes `content` to `path`, gzip-compressed (level 9) when the path ends in ".gz".
// Writes a sibling temporary file and renames it, so a failure leaves no half file.
// Throws Error(NotFound) if the directory cannot be written.
void write_text_file(const std::string& path, std::string_view content);

}  // namespace dynapipe::data_detail
