// Small statistics shared by the modules that summarise measurements (profiles, training
// metrics, the measured tables).
#pragma once

#include <vector>

namespace dynapipe {

// The middle value of `values` (the mean of the two middle ones for an even count); 0 for
// none, as a summary of no steps reports.
double median(std::vector<double> values);

}  // namespace dynapipe
