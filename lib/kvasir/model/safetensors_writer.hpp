// safetensors writer: write_safetensors, which captures (and tests) use to
// write tensors in the canonical layout, atomically. The format and the
// reader are in safetensors.hpp.
#pragma once

#include "kvasir/core/tensor.hpp"

#include <map>
#include <string>

namespace kvasir {

// Write `tensors` (kvasir dtypes f64/f32/f16/bf16/i32) and `metadata` to
// `path` in canonical form: header JSON with keys in sorted order, padded with
// spaces to a multiple of 8 bytes; data ordered by element size (largest
// first) and then by name, so with the 8-aligned header every tensor is
// naturally aligned in the file and readers can use it in place (the
// reference writer orders data the same way). Atomic: the bytes go to a
// temporary file in the same directory, which is fsynced, renamed over
// `path`, and the directory fsynced; on any failure the temporary file is
// removed and a file already at `path` is left untouched. Throws
// Error(bad_input) "PATH: problem" (bad name, not UTF-8, I/O failure, ...).
void write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kvasir
