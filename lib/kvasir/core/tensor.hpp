// Host tensors: a dtype tag, a shape (row-major, last dim contiguous) and a
// buffer. `Tensor` owns 64-byte aligned memory; `TensorView` borrows (e.g. a
// weight inside a memory-mapped checkpoint). Backends exchange activations as
// Tensors of their output precision (f64 for the oracle, f32 otherwise) and
// read weights through views of whatever dtype the file holds.
#pragma once

#include "kvasir/core/dtype.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvasir {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& s);              // "[16, 2048]"
// Element count; throws bad_input on a negative dim or on overflow past 2^62.
std::int64_t shape_numel(const Shape& s);

struct TensorView {
    DType dtype = DType::f32;
    const void* data = nullptr;
    Shape shape;

    std::int64_t numel() const { return shape_numel(shape); }
    std::int64_t dim(int i) const;  // negative i counts from the back
    int rank() const { return static_cast<int>(shape.size()); }
    double at(std::int64_t i) const { return load_as_f64(dtype, data, static_cast<std::size_t>(i)); }
    template <typename T>
    const T* as() const;  // checks that T matches dtype
    // Row r of a tensor viewed as [rows, last dim].
    TensorView row(std::int64_t r) const;
};

class Tensor {
public:
    Tensor() = default;
    Tensor(DType dtype, Shape shape);  // zero-filled
    Tensor(const Tensor& other);
    Tensor& operator=(const Tensor& other);
    Tensor(Tensor&&) noexcept = default;
    Tensor& operator=(Tensor&&) noexcept = default;

    static Tensor from_f64(std::span<const double> values, Shape shape, DType dtype = DType::f64);
    static Tensor from_f32(std::span<const float> values, Shape shape);
    // A copy of `view` converted (rounded) to dtype.
    static Tensor convert(const TensorView& view, DType dtype);

    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    std::int64_t numel() const { return numel_; }
    std::int64_t dim(int i) const { return view().dim(i); }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
    bool empty() const { return numel_ == 0; }

    void* raw() { return data_.get(); }
    const void* raw() const { return data_.get(); }
    template <typename T>
    T* as();
    template <typename T>
    const T* as() const;

    double at(std::int64_t i) const { return load_as_f64(dtype_, data_.get(), static_cast<std::size_t>(i)); }
    void set(std::int64_t i, double x) { store_from_f64(dtype_, data_.get(), static_cast<std::size_t>(i), x); }
    std::vector<double> to_f64() const;

    TensorView view() const { return TensorView{dtype_, data_.get(), shape_}; }
    operator TensorView() const { return view(); }  // NOLINT: views are the lingua franca of op arguments
    // Reinterpret with another shape of the same element count.
    Tensor reshaped(Shape shape) &&;

private:
    struct Free {
        void operator()(std::byte* p) const noexcept;
    };
    DType dtype_ = DType::f32;
    Shape shape_;
    std::int64_t numel_ = 0;
    std::unique_ptr<std::byte[], Free> data_;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::i32; }

// A vector [N] repeated as `rows` rows [rows, N] (bias / gate broadcast),
// same dtype: exact host data movement.
Tensor broadcast_rows(const TensorView& vec, std::int64_t rows);
// x [rows, cols] → [cols, rows], same dtype (exact host data movement).
Tensor transposed(const TensorView& x);

}  // namespace kvasir
