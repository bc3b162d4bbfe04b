// How numbers are written in every table and message: the verdict
// explanations (audit/) and the terminal reports (report/) share them.
#pragma once

#include <string>

namespace kvasir {

// Number formats used in every table.
std::string fmt_sci(double v);     // 3.5e-10, "nan", "inf", "0"
std::string fmt_cosine(double v);  // "1", "1-2.1e-13" when within 1e-5 of 1, else 0.9999712345; "nan"
std::string fmt_rate(double v);    // 99.5%
// `digits` decimals ("{:.Nf}") / significant digits ("{:.Ng}"); a NaN of
// either sign is "nan", as the JSON report writes it (never "-nan").
std::string fmt_fixed(double v, int digits);
std::string fmt_general(double v, int digits);

}  // namespace kvasir
