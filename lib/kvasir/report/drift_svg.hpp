// Drift against depth drawn as an SVG plot.
#pragma once

#include "kvasir/report/writers.hpp"

#include <string>
#include <vector>

namespace kvasir {

// SVG plot of drift against depth, log-log axes, one polyline per node
// (class="series") with its alpha in the legend, and two guides
// (class="guide") through the geometric mean of the depth-1 values:
// ∝ √L (incoherent growth) and ∝ L (coherent growth). Values that are not
// finite and positive cannot sit on a log axis: they are left out (a gap)
// and the legend says "identical" for a series with no positive value.
std::string drift_svg(const std::vector<DriftSeries>& series);

}  // namespace kvasir
