// TextTable: aligned plain-text / Markdown tables for the CLI's human output.
//
//   TextTable t({"strategy", "ms"});
//   t.add_row({"dynapipe", "12.3"});
//   std::cout << t.to_markdown();
#pragma once

#include <string>
#include <vector>

namespace dynapipe {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  // Throws InvalidArgument if the row's width differs from the header's.
  void add_row(std::vector<std::string> cells);
  // A Markdown table with columns padded to equal width (readable as plain text too).
  std::string to_markdown() const;
  std::size_t num_rows() const { return rows_.size(); }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Fixed-point formatting helper: format_fixed(3.14159, 2) == "3.14".
std::string format_fixed(double value, int digits);

}  // namespace dynapipe
