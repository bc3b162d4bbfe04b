#include "kvasir/core/tensor.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvasir {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::int64_t shape_numel(const Shape& s) {
    constexpr std::int64_t limit = std::int64_t{1} << 62;
    std::int64_t n = 1;
    for (std::int64_t d : s) {
        KVASIR_CHECK(d >= 0, ErrorCode::bad_input, "negative dimension in shape {}", shape_str(s));
        if (d != 0 && n > limit / d) fail(ErrorCode::bad_input, "shape {} has too many elements", shape_str(s));
        n *= d;
    }
    return n;
}

std::int64_t TensorView::dim(int i) const {
    const int r = rank();
    const int k = i < 0 ? r + i : i;
    KVASIR_CHECK(k >= 0 && k < r, ErrorCode::internal, "dim {} out of range for shape {}", i, shape_str(shape));
    return shape[static_cast<std::size_t>(k)];
}

const void* TensorView::fetched_host() const { return device->host() + device_offset; }

template <typename T>
const T* TensorView::as() const {
    KVASIR_CHECK(dtype == dtype_of<T>(), ErrorCode::internal, "tensor is {}, not {}", dtype_name(dtype),
                 dtype_name(dtype_of<T>()));
    return static_cast<const T*>(host_data());
}
template const double* TensorView::as<double>() const;
template const float* TensorView::as<float>() const;
template const std::int32_t* TensorView::as<std::int32_t>() const;

TensorView TensorView::row(std::int64_t r) const {
    KVASIR_ASSERT(rank() >= 1);
    const std::int64_t cols = dim(-1);
    const std::int64_t rows = cols == 0 ? 0 : numel() / cols;
    KVASIR_ASSERT(r >= 0 && r < rows);
    return part(static_cast<std::size_t>(r * cols) * dtype_size(dtype), Shape{cols});
}

TensorView TensorView::part(std::size_t offset, Shape part_shape) const {
    const auto* base = static_cast<const std::byte*>(data);
    return TensorView{dtype, base != nullptr ? base + offset : nullptr, std::move(part_shape), device, device_offset + offset};
}

DeviceCopy::~DeviceCopy() = default;

const std::byte* DeviceCopy::host() const {
    if (fetched_.load(std::memory_order_acquire)) return host_.get();
    const std::lock_guard lock(mutex_);
    if (!fetched_.load(std::memory_order_relaxed)) {
        const std::size_t bytes = static_cast<std::size_t>(numel_) * dtype_size(dtype_);
        auto buffer = std::make_unique<std::byte[]>(std::max<std::size_t>(bytes, 1));
        if (bytes != 0) fetch(buffer.get());
        host_ = std::move(buffer);
        fetched_.store(true, std::memory_order_release);
    }
    return host_.get();
}

namespace {
thread_local int residency_depth = 0;
}  // namespace

DeviceResidency::DeviceResidency(bool enable) : enabled_(enable) {
    if (enabled_) ++residency_depth;
}
DeviceResidency::~DeviceResidency() {
    if (enabled_) --residency_depth;
}
bool DeviceResidency::active() { return residency_depth > 0; }

void Tensor::Free::operator()(std::byte* p) const noexcept { std::free(p); }

std::unique_ptr<std::byte[], Tensor::Free> Tensor::allocate(std::size_t bytes) {
    const std::size_t rounded = ((bytes + 63) / 64) * 64;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    return std::unique_ptr<std::byte[], Free>(p);
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)) {
    data_ = allocate(nbytes());
}

// A device result is shared, not copied: it is immutable, and either copy
// that the host then writes to takes host bytes of its own first.
Tensor::Tensor(const Tensor& other) : dtype_(other.dtype_), shape_(other.shape_), numel_(other.numel_) {
    if (other.device_) {
        device_ = other.device_;
        return;
    }
    data_ = allocate(nbytes());
    if (other.nbytes() != 0) std::memcpy(data_.get(), other.data_.get(), other.nbytes());
}

Tensor Tensor::on_device(Shape shape, std::shared_ptr<const DeviceCopy> copy) {
    KVASIR_ASSERT(copy != nullptr);
    Tensor t;
    t.dtype_ = copy->dtype();
    t.shape_ = std::move(shape);
    t.numel_ = shape_numel(t.shape_);
    KVASIR_CHECK(t.numel_ == copy->numel(), ErrorCode::internal, "device result of {} elements viewed as {}", copy->numel(),
                 shape_str(t.shape_));
    t.device_ = std::move(copy);
    return t;
}

TensorView Tensor::view() const {
    if (!device_) return TensorView{dtype_, data_.get(), shape_};
    const void* host = DeviceResidency::active() && !device_->fetched() ? nullptr : device_->host();
    return TensorView{dtype_, host, shape_, device_.get(), 0};
}

void* Tensor::own_host() {
    if (device_) {
        auto own = allocate(nbytes());
        if (nbytes() != 0) std::memcpy(own.get(), device_->host(), nbytes());
        data_ = std::move(own);
        device_.reset();
    }
    return data_.get();
}

Tensor& Tensor::operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
}

Tensor Tensor::from_f64(std::span<const double> values, Shape shape, DType dtype) {
    Tensor t(dtype, std::move(shape));
    KVASIR_ASSERT(static_cast<std::int64_t>(values.size()) == t.numel());
    for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<std::int64_t>(i), values[i]);
    return t;
}

Tensor Tensor::from_f32(std::span<const float> values, Shape shape) {
    Tensor t(DType::f32, std::move(shape));
    KVASIR_ASSERT(static_cast<std::int64_t>(values.size()) == t.numel());
    if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
    return t;
}

Tensor Tensor::convert(const TensorView& view, DType dtype) {
    Tensor t(dtype, view.shape);
    const void* const data = view.host_data();
    if (view.dtype == dtype) {
        if (t.nbytes() != 0) std::memcpy(t.raw(), data, t.nbytes());
        return t;
    }
    const std::int64_t n = t.numel();
    // Hot paths (weights entering a backend): typed loops instead of the
    // per-element dtype switch.
    if (view.dtype == DType::f32 && dtype == DType::f64) {
        const float* src = static_cast<const float*>(data);
        double* dst = t.as<double>();
        for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
        return t;
    }
    if (view.dtype == DType::f64 && dtype == DType::f32) {
        const double* src = static_cast<const double*>(data);
        float* dst = t.as<float>();
        for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
        return t;
    }
    if ((view.dtype == DType::bf16 || view.dtype == DType::f16) && (dtype == DType::f32 || dtype == DType::f64)) {
        const auto* src = static_cast<const std::uint16_t*>(data);
        const bool bf = view.dtype == DType::bf16;
        for (std::int64_t i = 0; i < n; ++i) {
            const float v = bf ? bf16_bits_to_f32(src[i]) : f16_bits_to_f32(src[i]);
            if (dtype == DType::f32) t.as<float>()[i] = v;
            else t.as<double>()[i] = v;
        }
        return t;
    }
    for (std::int64_t i = 0; i < n; ++i) t.set(i, load_as_f64(view.dtype, data, static_cast<std::size_t>(i)));
    return t;
}

template <typename T>
T* Tensor::as() {
    KVASIR_CHECK(dtype_ == dtype_of<T>(), ErrorCode::internal, "tensor is {}, not {}", dtype_name(dtype_),
                 dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(own_host());
}
template <typename T>
const T* Tensor::as() const {
    KVASIR_CHECK(dtype_ == dtype_of<T>(), ErrorCode::internal, "tensor is {}, not {}", dtype_name(dtype_),
                 dtype_name(dtype_of<T>()));
    return static_cast<const T*>(raw());
}
template double* Tensor::as<double>();
template float* Tensor::as<float>();
template std::int32_t* Tensor::as<std::int32_t>();
template const double* Tensor::as<double>() const;
template const float* Tensor::as<float>() const;
template const std::int32_t* Tensor::as<std::int32_t>() const;

std::vector<double> Tensor::to_f64() const {
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::int64_t i = 0; i < numel_; ++i) out[static_cast<std::size_t>(i)] = at(i);
    return out;
}

Tensor Tensor::reshaped(Shape shape) && {
    KVASIR_CHECK(shape_numel(shape) == numel_, ErrorCode::internal, "cannot reshape {} to {}", shape_str(shape_),
                 shape_str(shape));
    shape_ = std::move(shape);
    return std::move(*this);
}

Tensor broadcast_rows(const TensorView& vec, std::int64_t rows) {
    const std::int64_t n = vec.numel();
    Tensor out(vec.dtype, {rows, n});
    const std::size_t row_bytes = static_cast<std::size_t>(n) * dtype_size(vec.dtype);
    for (std::int64_t r = 0; r < rows; ++r)
        if (row_bytes > 0) std::memcpy(static_cast<std::byte*>(out.raw()) + static_cast<std::size_t>(r) * row_bytes, vec.host_data(), row_bytes);
    return out;
}

Tensor transposed(const TensorView& x) {
    KVASIR_CHECK(x.rank() == 2, ErrorCode::internal, "transposed: {} is not a matrix", shape_str(x.shape));
    const std::int64_t rows = x.dim(0), cols = x.dim(1);
    const std::size_t es = dtype_size(x.dtype);
    Tensor out(x.dtype, {cols, rows});
    const auto* src = static_cast<const std::byte*>(x.host_data());
    auto* dst = static_cast<std::byte*>(out.raw());
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
            std::memcpy(dst + static_cast<std::size_t>(c * rows + r) * es, src + static_cast<std::size_t>(r * cols + c) * es, es);
    return out;
}

}  // namespace kvasir
