// Helpers the audit output formats share (one definition each): XML
// escaping for JUnit, the SVGs and the HTML page, and — internal to the
// writers, not a public API — the pair-matrix shape check, scalar rendering,
// shortest round-trip numbers, SVG coordinates and the series styles of the
// plots (colour and marker shape).
#pragma once

#include "kvasir/audit/results.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace kvasir {

// Minimal XML text/attribute escaping: & < > " '. Control characters other
// than tab/LF/CR (not allowed in XML 1.0) become U+FFFD.
std::string xml_escape(std::string_view text);

namespace writers_detail {

// Error(internal) unless max_abs and cosine are nodes.size() × nodes.size().
void check_matrix(const PairMatrix& m);
// A JSON scalar as text: a string as itself, anything else as dumped JSON.
std::string scalar_text(const nlohmann::ordered_json& v);
// Shortest round-trip form; "nan", "inf", "-inf" for the non-finite.
std::string shortest(double x);
// An SVG coordinate or size: two decimals.
std::string num(double x);

// Plot series that stay apart for readers who do not see every colour and in
// grey print: series i gets the Okabe–Ito colour i mod 7 (yellow left out:
// unreadable on white) and the marker shape i mod 5 — 7 and 5 are coprime, so
// the first 35 series all differ in colour or shape.
enum class Marker { circle, square, triangle, diamond, triangle_down, cross };
const char* series_colour(std::size_t i);
Marker series_marker(std::size_t i);
// One SVG marker centred on (x, y) with "radius" r (the shapes have about
// equal area), filled with `fill`; a non-empty title becomes its tooltip
// (escaped here).
std::string marker_svg(Marker m, double x, double y, double r, std::string_view fill, std::string_view title = {});

}  // namespace writers_detail

}  // namespace kvasir
