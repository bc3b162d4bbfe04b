// The headline cosine pair matrix drawn as an SVG heatmap.
#pragma once

#include "kvasir/report/writers.hpp"

#include <string>

namespace kvasir {

// SVG heatmap of the cosine matrix: an n×n grid, rows = reference node,
// columns = candidate; each off-diagonal cell (class="cell") is coloured by
// log10(1 − cosine) clamped to [1e-16, 1] (green: identical to the last bit
// of f64; yellow: 1e-8; red: 1 − cos ≥ 1e-1) and labelled with the cosine
// and max|Δ|; diagonal cells have class="diag"; not-measured cells are grey.
// A colour bar gives the scale.
std::string heatmap_svg(const PairMatrix& m);

}  // namespace kvasir
