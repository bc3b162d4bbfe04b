// Drift against depth drawn as an SVG plot.
#pragma once

#include "kvasir/audit/results.hpp"

#include <cstddef>
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
// The same plot in the series styles of the HTML report: series i in
// series_colour(style[i]) with marker shape series_marker(style[i])
// (writers_common.hpp) — a node keeps its colour and shape in every plot of
// the page — with markers on about 16 points per series (each with its value
// as tooltip), so many nodes over many layers stay apart and the file small.
// Error(internal) unless style.size() == series.size().
std::string drift_svg(const std::vector<DriftSeries>& series, const std::vector<std::size_t>& style);

}  // namespace kvasir
