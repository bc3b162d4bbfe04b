// The two non-finite doubles every statistic and verdict writes: one
// definition for the whole tool.
#pragma once

#include <limits>

namespace kvasir {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace kvasir
