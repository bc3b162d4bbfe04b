// Host tensors: a dtype tag, a shape (row-major, last dim contiguous) and a
// buffer. `Tensor` owns 64-byte aligned memory; `TensorView` borrows (e.g. a
// weight inside a memory-mapped checkpoint). Backends exchange activations as
// Tensors of their output precision (f64 for the oracle, f32 otherwise) and
// read weights through views of whatever dtype the file holds.
//
// Device-resident results (issue #38). Inside a DeviceResidency scope (the
// decoder opens one around each forward pass) a device node may leave an op's
// result on its device: the Tensor then holds a DeviceCopy instead of host
// bytes, the node's next op reads it where it is, and the bytes come to the
// host only when something on the host reads them (once; kept after). A view
// of such a tensor carries the DeviceCopy; taken inside the scope before the
// bytes were fetched, its `data` is null — host code reads a view through
// host_data(), and a raw read of `data` fails loudly instead of reading stale
// memory. Outside every scope, views always carry host bytes, so no code
// outside the forward pass ever sees a null `data`.
#pragma once

#include "kvasir/core/dtype.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace kvasir {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& s);              // "[16, 2048]"
// Element count; throws bad_input on a negative dim or on overflow past 2^62.
std::int64_t shape_numel(const Shape& s);

class DeviceCopy;

struct TensorView {
    DType dtype = DType::f32;
    const void* data = nullptr;  // host bytes; null for a device result not yet fetched (see above)
    Shape shape;
    // The device result this view is part of, from byte `device_offset` of it
    // (its host bytes, once fetched): a device node uses it in place.
    const DeviceCopy* device = nullptr;
    std::size_t device_offset = 0;

    // The host bytes: `data`, or the device result's bytes fetched now (blocking, once).
    const void* host_data() const { return data != nullptr || device == nullptr ? data : fetched_host(); }

    std::int64_t numel() const { return shape_numel(shape); }
    std::int64_t dim(int i) const;  // negative i counts from the back
    int rank() const { return static_cast<int>(shape.size()); }
    double at(std::int64_t i) const { return load_as_f64(dtype, host_data(), static_cast<std::size_t>(i)); }
    template <typename T>
    const T* as() const;  // checks that T matches dtype
    // Row r of a tensor viewed as [rows, last dim].
    TensorView row(std::int64_t r) const;
    // The elements from byte `offset` on, viewed as `shape` (the caller
    // keeps it inside this view): a device result's part stays on the device.
    TensorView part(std::size_t offset, Shape shape) const;

private:
    const void* fetched_host() const;  // device->host() + device_offset
};

// A device node's result kept on its device: immutable (no op writes it
// after the one that produced it), its host copy fetched on the first host
// read and kept. A node subclasses it with its buffer (opencl_backend.cpp).
class DeviceCopy {
public:
    virtual ~DeviceCopy();
    DeviceCopy(const DeviceCopy&) = delete;
    DeviceCopy& operator=(const DeviceCopy&) = delete;

    DType dtype() const { return dtype_; }
    std::int64_t numel() const { return numel_; }
    // numel() elements of dtype() on the host: fetched on the first call
    // (blocking; thread safe; a failed fetch throws and is retried by the next call).
    const std::byte* host() const;
    bool fetched() const { return fetched_.load(std::memory_order_acquire); }

protected:
    DeviceCopy(DType dtype, std::int64_t numel) : dtype_(dtype), numel_(numel) {}
    // Copy the device bytes, as numel() elements of dtype(), to dst.
    virtual void fetch(void* dst) const = 0;

private:
    DType dtype_;
    std::int64_t numel_;
    mutable std::mutex mutex_;
    mutable std::atomic<bool> fetched_{false};
    mutable std::unique_ptr<std::byte[]> host_;
};

// While one lives on a thread, device nodes called from that thread may
// leave their results on the device (DeviceCopy). Nested scopes are fine;
// `enable = false` opens none (a caller that wants host results throughout).
class DeviceResidency {
public:
    explicit DeviceResidency(bool enable = true);
    ~DeviceResidency();
    DeviceResidency(const DeviceResidency&) = delete;
    DeviceResidency& operator=(const DeviceResidency&) = delete;
    static bool active();

private:
    bool enabled_;
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
    // A result left on a device: `copy` holds its numel elements of dtype.
    static Tensor on_device(Shape shape, std::shared_ptr<const DeviceCopy> copy);

    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    std::int64_t numel() const { return numel_; }
    std::int64_t dim(int i) const { return view().dim(i); }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
    bool empty() const { return numel_ == 0; }

    // Host bytes. The const accessors fetch a device result (once); the
    // mutable ones give the tensor host bytes of its own first (the device
    // copy is dropped: the host is about to change them).
    void* raw() { return own_host(); }
    const void* raw() const { return device_ ? device_->host() : data_.get(); }
    // The device result this tensor is, or null (a host tensor).
    const DeviceCopy* device() const { return device_.get(); }
    template <typename T>
    T* as();
    template <typename T>
    const T* as() const;

    double at(std::int64_t i) const { return load_as_f64(dtype_, raw(), static_cast<std::size_t>(i)); }
    void set(std::int64_t i, double x) { store_from_f64(dtype_, own_host(), static_cast<std::size_t>(i), x); }
    std::vector<double> to_f64() const;

    // A device result's view carries its DeviceCopy, and host bytes unless
    // it is taken inside a DeviceResidency scope before they were fetched.
    TensorView view() const;
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
    std::unique_ptr<std::byte[], Free> data_;  // null while the tensor is a device result
    std::shared_ptr<const DeviceCopy> device_;

    static std::unique_ptr<std::byte[], Free> allocate(std::size_t bytes);
    void* own_host();
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
