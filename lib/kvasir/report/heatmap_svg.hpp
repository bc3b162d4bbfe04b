// Pair matrices drawn as SVG heatmaps: the headline cosine heatmap (its own
// file, --svg-heatmap) and the per-metric log-scale heatmaps of the HTML
// report. Both draw the same grid (rows = reference node, columns =
// candidate, labels rotated over the columns).
#pragma once

#include "kvasir/audit/results.hpp"

#include <string>

namespace kvasir {

// SVG heatmap of the cosine matrix: an n×n grid, rows = reference node,
// columns = candidate; each off-diagonal cell (class="cell") is coloured by
// log10(1 − cosine) clamped to [1e-16, 1] (green: identical to the last bit
// of f64; yellow: 1e-8; red: 1 − cos ≥ 1e-1) and labelled with the cosine
// and max|Δ|; diagonal cells have class="diag"; not-measured cells are grey.
// A colour bar gives the scale.
std::string heatmap_svg(const PairMatrix& m);

// What a metric heatmap shows.
enum class PairMetric {
    max_abs,           // max|Δ|; colour scale: the decades the matrix spans
    one_minus_cosine,  // 1 − cosine; colour scale: 1e-16 (f64 round-off) … 1
};

// One metric of a pair matrix on a log colour scale, for the HTML report.
// Both metrics are symmetric in the pair, so each pair is drawn once: the
// cells above the diagonal, rows = nodes[0 … n−2] (the reference first),
// columns = nodes[1 … n−1] — half the cells and half the bytes of a full
// grid, which matters at 20 nodes × 10 ops. Each cell (class="cell") holds
// the value (3 digits; "0" for bit-identical; title: the pair and the
// full-precision value), coloured on a reversed viridis scale (perceptually
// uniform, colour-blind safe, monotone in lightness so it survives grey
// print): light yellow = identical, dark purple = the largest difference.
// NaN cells are black with "NaN", not-measured cells grey with "n/a". A
// stepped colour bar, one block per decade, gives the scale. No ids are
// defined, so any number of these can share one HTML page.
std::string pair_heatmap_svg(const PairMatrix& m, PairMetric metric);

}  // namespace kvasir
