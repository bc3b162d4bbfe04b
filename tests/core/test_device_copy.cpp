// Device-resident results (core/tensor.hpp, issue #38): a Tensor that holds
// a DeviceCopy fetches its bytes on the first host read and only then; its
// views inside a DeviceResidency scope carry no host pointer until fetched,
// outside one they always do; copies share the device result, and a host
// write gives the writer bytes of its own. A fake device (host memory that
// counts its fetches) stands in for a node's buffer; the OpenCL node's own
// copies are tested on PoCL (test_opencl_residency, test_forward).
#include "kvasir/core/error.hpp"
#include "kvasir/core/tensor.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

using namespace kvasir;

namespace {

class FakeCopy final : public DeviceCopy {
public:
    explicit FakeCopy(std::vector<float> values)
        : DeviceCopy(DType::f32, static_cast<std::int64_t>(values.size())), values_(std::move(values)) {}
    mutable int fetches = 0;
    mutable int failures_left = 0;  // the next this many fetches throw

private:
    void fetch(void* dst) const override {
        if (failures_left > 0) {
            --failures_left;
            throw std::runtime_error("device lost");
        }
        ++fetches;
        std::memcpy(dst, values_.data(), values_.size() * sizeof(float));
    }
    std::vector<float> values_;
};

std::shared_ptr<FakeCopy> fake(int n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
    return std::make_shared<FakeCopy>(std::move(v));
}

}  // namespace

TEST(DeviceCopy, NothingIsFetchedUntilTheHostReadsAndThenOnce) {
    const auto copy = fake(12);
    const Tensor t = Tensor::on_device({3, 4}, copy);
    EXPECT_EQ(t.device(), copy.get());
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_EQ(t.numel(), 12);
    EXPECT_EQ(copy->fetches, 0);
    EXPECT_EQ(t.at(5), -0.5);  // 0.5·5 − 3
    EXPECT_EQ(copy->fetches, 1);
    EXPECT_EQ(t.as<float>()[11], 2.5f);
    EXPECT_EQ(t.to_f64()[0], -3.0);
    EXPECT_EQ(copy->fetches, 1);
}

TEST(DeviceCopy, InsideAScopeAViewCarriesNoHostPointerUntilFetched) {
    const auto copy = fake(8);
    const Tensor t = Tensor::on_device({2, 4}, copy);
    {
        const DeviceResidency scope;
        EXPECT_TRUE(DeviceResidency::active());
        const TensorView v = t;
        EXPECT_EQ(v.data, nullptr);
        EXPECT_EQ(v.device, copy.get());
        EXPECT_EQ(copy->fetches, 0);
        // A row of it: the device and the offset travel, still nothing fetched.
        const TensorView r = v.row(1);
        EXPECT_EQ(r.data, nullptr);
        EXPECT_EQ(r.device, copy.get());
        EXPECT_EQ(r.device_offset, 4 * sizeof(float));
        EXPECT_EQ(copy->fetches, 0);
        EXPECT_EQ(r.at(0), -1.0);  // element 4: host_data() fetches
        EXPECT_EQ(copy->fetches, 1);
        // Once fetched, views carry the host bytes too.
        EXPECT_NE(TensorView(t).data, nullptr);
    }
    EXPECT_FALSE(DeviceResidency::active());
}

TEST(DeviceCopy, OutsideEveryScopeAViewAlwaysCarriesHostBytes) {
    const auto copy = fake(4);
    const Tensor t = Tensor::on_device({4}, copy);
    const TensorView v = t;
    ASSERT_NE(v.data, nullptr);
    EXPECT_EQ(v.device, copy.get());
    EXPECT_EQ(static_cast<const float*>(v.data)[3], -1.5f);
    EXPECT_EQ(copy->fetches, 1);
}

TEST(DeviceCopy, ScopesNestAndADisabledOneOpensNone) {
    EXPECT_FALSE(DeviceResidency::active());
    {
        const DeviceResidency off(false);
        EXPECT_FALSE(DeviceResidency::active());
        const DeviceResidency outer;
        {
            const DeviceResidency inner;
            EXPECT_TRUE(DeviceResidency::active());
        }
        EXPECT_TRUE(DeviceResidency::active());
    }
    EXPECT_FALSE(DeviceResidency::active());
}

TEST(DeviceCopy, CopiesShareTheResultAndAHostWriteTakesBytesOfItsOwn) {
    const auto copy = fake(6);
    const Tensor a = Tensor::on_device({6}, copy);
    Tensor b = a;  // shared: nothing fetched, nothing copied
    EXPECT_EQ(b.device(), copy.get());
    EXPECT_EQ(copy->fetches, 0);
    b.set(2, 42.0);  // b now owns host bytes: the device copy is dropped
    EXPECT_EQ(b.device(), nullptr);
    EXPECT_EQ(copy->fetches, 1);
    EXPECT_EQ(b.at(2), 42.0);
    EXPECT_EQ(b.at(3), -1.5);
    EXPECT_EQ(a.at(2), -2.0);  // a still reads the device result
    EXPECT_EQ(a.device(), copy.get());
    Tensor c = a;
    static_cast<float*>(c.raw())[0] = 7.0f;
    EXPECT_EQ(a.at(0), -3.0);
    EXPECT_EQ(c.at(0), 7.0);
    EXPECT_EQ(copy->fetches, 1);  // one fetch served all three
}

TEST(DeviceCopy, ReshapeConvertAndMoveKeepTheDeviceResult) {
    const auto copy = fake(6);
    Tensor t = Tensor::on_device({6}, copy);
    Tensor r = std::move(t).reshaped({2, 3});
    EXPECT_EQ(r.device(), copy.get());
    EXPECT_EQ(copy->fetches, 0);
    const Tensor d = Tensor::convert(r, DType::f64);
    EXPECT_EQ(d.dtype(), DType::f64);
    EXPECT_EQ(d.at(5), -0.5);
    EXPECT_EQ(copy->fetches, 1);
}

TEST(DeviceCopy, AFailedFetchThrowsAndTheNextReadRetries) {
    const auto copy = fake(3);
    copy->failures_left = 1;
    const Tensor t = Tensor::on_device({3}, copy);
    EXPECT_THROW((void)t.at(0), std::runtime_error);
    EXPECT_FALSE(copy->fetched());
    EXPECT_EQ(t.at(1), -2.5);
    EXPECT_TRUE(copy->fetched());
    EXPECT_EQ(copy->fetches, 1);
}

TEST(DeviceCopy, AShapeThatDoesNotHoldTheResultIsRefused) {
    EXPECT_THROW((void)Tensor::on_device({5}, fake(6)), Error);
}
