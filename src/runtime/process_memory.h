// This process's resident memory from /proc/self/status, for the runtime's metrics and
// the memory benches. Linux only; 0 where a field is missing.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace dynapipe::runtime {

// A "Vm...:" line of /proc/self/status (e.g. "VmRSS:", "VmHWM:") in bytes.
inline std::int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      std::istringstream fields(line.substr(field.size()));
      std::int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0: "5" to /proc/self/clear_refs); where
// that is not allowed VmHWM stays the process-lifetime peak.
inline void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (out) out << "5";
}

}  // namespace dynapipe::runtime
