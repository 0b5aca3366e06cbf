#include "dynapipe/report/table.h"

#include <algorithm>
#include <cstdio>

#include "dynapipe/core/error.h"

namespace dynapipe {

TextTable::TextTable(std::vector<std::string> header) : header_(std::move(header)) {}

void TextTable::add_row(std::vector<std::string> cells) {
  if (cells.size() != header_.size()) {
    throw Error(ErrorKind::InvalidArgument,
                cat("table row must have ", header_.size(), " cells, got ", cells.size()));
  }
  rows_.push_back(std::move(cells));
}

std::string TextTable::to_markdown() const {
  std::vector<std::size_t> width(header_.size());
  for (std::size_t c = 0; c < header_.size(); ++c) width[c] = std::max<std::size_t>(3, header_[c].size());
  for (const auto& row : rows_) {
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (std::size_t c = 0; c < cells.size(); ++c) {
      out += " " + cells[c] + std::string(width[c] - cells[c].size(), ' ') + " |";
    }
    return out + "\n";
  };
  std::string out = line(header_);
  out += "|";
  for (std::size_t w : width) out += std::string(w + 2, '-') + "|";
  out += "\n";
  for (const auto& row : rows_) out += line(row);
  return out;
}

std::string format_fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

}  // namespace dynapipe
