// Helpers the audit output formats share (one definition each): XML
// escaping for JUnit and both SVGs, and — internal to the writers, not a
// public API — the pair-matrix shape check, scalar rendering, shortest
// round-trip numbers and SVG coordinates.
#pragma once

#include "kvasir/report/writers.hpp"

#include <nlohmann/json.hpp>

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

}  // namespace writers_detail

}  // namespace kvasir
