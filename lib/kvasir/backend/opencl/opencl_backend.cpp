// opencl: host side — device enumeration, RAII over the C API, a per-device
// runtime (context, queue, program cache) and the ops. The contract and the
// numerics are documented in opencl_backend.hpp; kernels in kernels/opencl.
#include "kvasir/backend/opencl/opencl_backend.hpp"
#include "kvasir/backend/device_pool.hpp"

#include "kernels/cpu/matmul.hpp"
#include "kvasir/backend/weight_cache.hpp"
#include "kvasir/core/error.hpp"

#include <CL/cl.h>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <array>
#include <cstdio>
#include <cstring>
#include <bit>
#include <map>
#include <memory>
#include <numeric>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace kvasir {
namespace {

// --- errors ------------------------------------------------------------------------

const char* cl_error_name(cl_int code) {
    // Numeric so the table does not depend on CL_TARGET_OPENCL_VERSION.
    switch (code) {
        case 0: return "CL_SUCCESS";
        case -1: return "CL_DEVICE_NOT_FOUND";
        case -2: return "CL_DEVICE_NOT_AVAILABLE";
        case -3: return "CL_COMPILER_NOT_AVAILABLE";
        case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
        case -5: return "CL_OUT_OF_RESOURCES";
        case -6: return "CL_OUT_OF_HOST_MEMORY";
        case -7: return "CL_PROFILING_INFO_NOT_AVAILABLE";
        case -8: return "CL_MEM_COPY_OVERLAP";
        case -9: return "CL_IMAGE_FORMAT_MISMATCH";
        case -10: return "CL_IMAGE_FORMAT_NOT_SUPPORTED";
        case -11: return "CL_BUILD_PROGRAM_FAILURE";
        case -12: return "CL_MAP_FAILURE";
        case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
        case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
        case -15: return "CL_COMPILE_PROGRAM_FAILURE";
        case -16: return "CL_LINKER_NOT_AVAILABLE";
        case -17: return "CL_LINK_PROGRAM_FAILURE";
        case -18: return "CL_DEVICE_PARTITION_FAILED";
        case -19: return "CL_KERNEL_ARG_INFO_NOT_AVAILABLE";
        case -30: return "CL_INVALID_VALUE";
        case -31: return "CL_INVALID_DEVICE_TYPE";
        case -32: return "CL_INVALID_PLATFORM";
        case -33: return "CL_INVALID_DEVICE";
        case -34: return "CL_INVALID_CONTEXT";
        case -35: return "CL_INVALID_QUEUE_PROPERTIES";
        case -36: return "CL_INVALID_COMMAND_QUEUE";
        case -37: return "CL_INVALID_HOST_PTR";
        case -38: return "CL_INVALID_MEM_OBJECT";
        case -39: return "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR";
        case -40: return "CL_INVALID_IMAGE_SIZE";
        case -41: return "CL_INVALID_SAMPLER";
        case -42: return "CL_INVALID_BINARY";
        case -43: return "CL_INVALID_BUILD_OPTIONS";
        case -44: return "CL_INVALID_PROGRAM";
        case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
        case -46: return "CL_INVALID_KERNEL_NAME";
        case -47: return "CL_INVALID_KERNEL_DEFINITION";
        case -48: return "CL_INVALID_KERNEL";
        case -49: return "CL_INVALID_ARG_INDEX";
        case -50: return "CL_INVALID_ARG_VALUE";
        case -51: return "CL_INVALID_ARG_SIZE";
        case -52: return "CL_INVALID_KERNEL_ARGS";
        case -53: return "CL_INVALID_WORK_DIMENSION";
        case -54: return "CL_INVALID_WORK_GROUP_SIZE";
        case -55: return "CL_INVALID_WORK_ITEM_SIZE";
        case -56: return "CL_INVALID_GLOBAL_OFFSET";
        case -57: return "CL_INVALID_EVENT_WAIT_LIST";
        case -58: return "CL_INVALID_EVENT";
        case -59: return "CL_INVALID_OPERATION";
        case -60: return "CL_INVALID_GL_OBJECT";
        case -61: return "CL_INVALID_BUFFER_SIZE";
        case -62: return "CL_INVALID_MIP_LEVEL";
        case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
        case -64: return "CL_INVALID_PROPERTY";
        case -65: return "CL_INVALID_IMAGE_DESCRIPTOR";
        case -66: return "CL_INVALID_COMPILER_OPTIONS";
        case -67: return "CL_INVALID_LINKER_OPTIONS";
        case -68: return "CL_INVALID_DEVICE_PARTITION_COUNT";
        case -69: return "CL_INVALID_PIPE_SIZE";
        case -70: return "CL_INVALID_DEVICE_QUEUE";
        case -71: return "CL_INVALID_SPEC_ID";
        case -72: return "CL_MAX_SIZE_RESTRICTION_EXCEEDED";
        case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
        default: return "unknown OpenCL error";
    }
}

// "lib/kvasir/backend/opencl/opencl_backend.cpp" rather than the build
// machine's absolute path.
const char* short_file(const char* file) {
    const char* lib = std::strstr(file, "lib/kvasir/");
    return lib != nullptr ? lib : file;
}

[[noreturn]] void cl_fail(cl_int code, std::string_view call, const char* file, int line) {
    fail(ErrorCode::backend_failure, "opencl: {} failed with {} ({}) at {}:{}", call, cl_error_name(code), code,
         short_file(file), line);
}

void cl_check(cl_int code, std::string_view statement, const char* file, int line) {
    // Report the called function, not the whole argument list.
    if (code != CL_SUCCESS) cl_fail(code, statement.substr(0, statement.find('(')), file, line);
}

// The clCreateX(..., cl_int* errcode_ret) calls: run, check, return the object.
template <typename F>
auto cl_create(const char* call, const char* file, int line, F&& create) {
    cl_int err = CL_SUCCESS;
    auto object = create(&err);
    if (err == CL_SUCCESS && object == nullptr) err = CL_INVALID_VALUE;  // never trust a null with "success"
    if (err != CL_SUCCESS) cl_fail(err, call, file, line);
    return object;
}

}  // namespace
}  // namespace kvasir

// KVCL_CHECK(clFoo(...)): throw Error(backend_failure) naming clFoo, the CL
// error and file:line. KVCL_CREATE(clCreateFoo, args...) appends the errcode
// pointer and does the same for the create-style calls.
#define KVCL_CHECK(call) ::kvasir::cl_check((call), #call, __FILE__, __LINE__)
#define KVCL_CREATE(fn, ...) \
    ::kvasir::cl_create(#fn, __FILE__, __LINE__, [&](cl_int* kvcl_err_) { return fn(__VA_ARGS__, kvcl_err_); })

namespace kvasir {
namespace {

// --- RAII ----------------------------------------------------------------------------

// Owns one reference to a CL object; move-only. Release errors are ignored:
// there is nothing useful to do with them in a destructor.
template <typename T, cl_int(CL_API_CALL* Release)(T)>
class ClHandle {
public:
    ClHandle() = default;
    explicit ClHandle(T handle) : handle_(handle) {}
    ClHandle(ClHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    ClHandle& operator=(ClHandle&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    ClHandle(const ClHandle&) = delete;
    ClHandle& operator=(const ClHandle&) = delete;
    ~ClHandle() { reset(); }

    T get() const { return handle_; }
    // Gives up ownership: the caller now holds the reference.
    T release() noexcept { return std::exchange(handle_, nullptr); }

private:
    void reset() noexcept {
        if (handle_ != nullptr) Release(handle_);
        handle_ = nullptr;
    }
    T handle_ = nullptr;
};

using ClContext = ClHandle<cl_context, clReleaseContext>;
using ClQueue = ClHandle<cl_command_queue, clReleaseCommandQueue>;
using ClProgram = ClHandle<cl_program, clReleaseProgram>;
using ClKernel = ClHandle<cl_kernel, clReleaseKernel>;
using ClMem = ClHandle<cl_mem, clReleaseMemObject>;

// A device buffer of the node's pool (backend/device_pool.hpp): given back
// to it, not released, when it goes. Move-only.
class PooledMem {
public:
    PooledMem() = default;
    PooledMem(ClMem mem, std::uint64_t bytes, DevicePool* pool) : mem_(std::move(mem)), bytes_(bytes), pool_(pool) {}
    PooledMem(PooledMem&& other) noexcept
        : mem_(std::move(other.mem_)), bytes_(other.bytes_), pool_(std::exchange(other.pool_, nullptr)) {}
    PooledMem& operator=(PooledMem&&) = delete;
    PooledMem(const PooledMem&) = delete;
    PooledMem& operator=(const PooledMem&) = delete;
    ~PooledMem() {
        if (pool_ != nullptr && mem_.get() != nullptr) pool_->give(mem_.release(), bytes_);
    }
    cl_mem get() const { return mem_.get(); }

private:
    ClMem mem_;
    std::uint64_t bytes_ = 0;
    DevicePool* pool_ = nullptr;
};

void release_cl_buffer(void* handle) { (void)clReleaseMemObject(static_cast<cl_mem>(handle)); }

// What a node's device results still need once the node is gone: the lock
// that serialises the node's use of the queue, its counters and its pool
// (a result gives its buffer back to the pool when the last tensor holding
// it goes). Recursive: a node that reads one of its own results on the host
// in the middle of an op (a host fallback) fetches it under its own lock.
struct NodeShared {
    std::recursive_mutex mutex;
    TransferStats transfers;
    std::unique_ptr<DevicePool> pool;
    // Host bytes of writes enqueued without a wait (an activation inside a
    // DeviceResidency scope): kept until the in-order queue's next wait,
    // which finishes them.
    std::vector<std::vector<std::byte>> in_flight;
    void waited() {
        ++transfers.syncs;
        in_flight.clear();
    }
};

// --- device queries -------------------------------------------------------------------

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\0' || s.back() == ' ' || s.back() == '\n')) s.pop_back();
    return s;
}

std::string device_string(cl_device_id d, cl_device_info what) {
    std::size_t n = 0;
    KVCL_CHECK(clGetDeviceInfo(d, what, 0, nullptr, &n));
    std::string s(n, '\0');
    KVCL_CHECK(clGetDeviceInfo(d, what, n, s.data(), nullptr));
    return trimmed(std::move(s));
}

std::string platform_string(cl_platform_id p, cl_platform_info what) {
    std::size_t n = 0;
    KVCL_CHECK(clGetPlatformInfo(p, what, 0, nullptr, &n));
    std::string s(n, '\0');
    KVCL_CHECK(clGetPlatformInfo(p, what, n, s.data(), nullptr));
    return trimmed(std::move(s));
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what) {
    T v{};
    KVCL_CHECK(clGetDeviceInfo(d, what, sizeof(T), &v, nullptr));
    return v;
}

bool has_extension(const std::string& extensions, std::string_view name) {
    std::size_t pos = 0;
    while ((pos = extensions.find(name, pos)) != std::string::npos) {
        const std::size_t end = pos + name.size();
        const bool starts = pos == 0 || extensions[pos - 1] == ' ';
        const bool ends = end == extensions.size() || extensions[end] == ' ';
        if (starts && ends) return true;
        pos = end;
    }
    return false;
}

struct DeviceInfo {
    int index = 0;
    cl_platform_id platform = nullptr;
    cl_device_id id = nullptr;
    std::string name, platform_name, platform_version, vendor, driver, device_version, opencl_c, extensions;
    cl_uint compute_units = 1;
    std::size_t max_work_group = 1;
    std::array<std::size_t, 3> max_work_item{1, 1, 1};
    cl_ulong local_mem = 0;  // CL_DEVICE_LOCAL_MEM_SIZE, bytes
    cl_ulong global_mem = 0;  // CL_DEVICE_GLOBAL_MEM_SIZE, bytes
    cl_uint base_align_bytes = 128;  // CL_DEVICE_MEM_BASE_ADDR_ALIGN / 8: a sub-buffer's offset is a multiple
    bool fp16 = false, fp64 = false;
    bool cpu = false;  // CL_DEVICE_TYPE_CPU: a work-group's items run one after another (PoCL)

    std::string label() const { return fmt::format("{} ({})", name, platform_name); }
};

struct Enumeration {
    std::vector<DeviceInfo> devices;
    std::string reason;  // why `devices` is empty
};

Enumeration enumerate_devices() {
    Enumeration out;
    cl_uint n_platforms = 0;
    const cl_int err = clGetPlatformIDs(0, nullptr, &n_platforms);
    if (err == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ || (err == CL_SUCCESS && n_platforms == 0)) {
        out.reason = "no OpenCL platform: the ICD loader found no driver (install pocl-opencl-icd or a GPU's OpenCL driver)";
        return out;
    }
    cl_check(err, "clGetPlatformIDs", __FILE__, __LINE__);
    std::vector<cl_platform_id> platforms(n_platforms);
    KVCL_CHECK(clGetPlatformIDs(n_platforms, platforms.data(), nullptr));
    std::vector<std::string> empty_platforms;
    for (cl_platform_id p : platforms) {
        const std::string pname = platform_string(p, CL_PLATFORM_NAME);
        cl_uint n_devices = 0;
        const cl_int derr = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n_devices);
        if (derr == CL_DEVICE_NOT_FOUND || (derr == CL_SUCCESS && n_devices == 0)) {
            empty_platforms.push_back(pname);
            continue;
        }
        cl_check(derr, "clGetDeviceIDs", __FILE__, __LINE__);
        std::vector<cl_device_id> ids(n_devices);
        KVCL_CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n_devices, ids.data(), nullptr));
        for (cl_device_id d : ids) {
            DeviceInfo info;
            info.index = static_cast<int>(out.devices.size());
            info.platform = p;
            info.id = d;
            info.platform_name = pname;
            info.platform_version = platform_string(p, CL_PLATFORM_VERSION);
            info.name = device_string(d, CL_DEVICE_NAME);
            info.vendor = device_string(d, CL_DEVICE_VENDOR);
            info.driver = device_string(d, CL_DRIVER_VERSION);
            info.device_version = device_string(d, CL_DEVICE_VERSION);
            info.opencl_c = device_string(d, CL_DEVICE_OPENCL_C_VERSION);
            info.extensions = device_string(d, CL_DEVICE_EXTENSIONS);
            info.compute_units = device_value<cl_uint>(d, CL_DEVICE_MAX_COMPUTE_UNITS);
            info.max_work_group = device_value<std::size_t>(d, CL_DEVICE_MAX_WORK_GROUP_SIZE);
            KVCL_CHECK(clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(info.max_work_item),
                                       info.max_work_item.data(), nullptr));
            info.local_mem = device_value<cl_ulong>(d, CL_DEVICE_LOCAL_MEM_SIZE);
            info.global_mem = device_value<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
            info.base_align_bytes = std::max<cl_uint>(1, device_value<cl_uint>(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8);
            info.fp16 = has_extension(info.extensions, "cl_khr_fp16");
            info.fp64 = has_extension(info.extensions, "cl_khr_fp64");
            info.cpu = (device_value<cl_device_type>(d, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_CPU) != 0;
            out.devices.push_back(std::move(info));
        }
    }
    if (out.devices.empty()) {
        std::string names;
        for (const std::string& s : empty_platforms) names += (names.empty() ? "" : ", ") + s;
        out.reason = fmt::format("{} OpenCL platform(s) ({}) but no device", n_platforms, names);
    }
    return out;
}

// Enumerated once per process: cl_platform_id/cl_device_id stay valid for the
// process and the per-device runtimes are keyed by them. A throwing first
// attempt leaves the static uninitialised, so the next call retries.
const Enumeration& devices() {
    static const Enumeration e = enumerate_devices();
    return e;
}

std::string first_lines(const std::string& text, int n) {
    std::string out;
    std::size_t pos = 0;
    for (int i = 0; i < n && pos < text.size(); ++i) {
        const std::size_t nl = text.find('\n', pos);
        const std::size_t end = nl == std::string::npos ? text.size() : nl;
        out += "    " + text.substr(pos, end - pos) + "\n";
        pos = end + 1;
    }
    if (pos < text.size()) out += "    [...]\n";
    if (out.empty()) out = "    (empty)\n";
    out.pop_back();
    return out;
}

// "-cl-std=CL1.2" where the device's OpenCL C is at least 1.2 (PoCL, most
// GPUs), "-cl-std=CL1.1" on a 1.1-only device, nothing on a 1.0 device.
std::string cl_std_option(const std::string& opencl_c) {
    int major = 1, minor = 0;
    if (std::sscanf(opencl_c.c_str(), "OpenCL C %d.%d", &major, &minor) != 2) return "";
    if (major > 1 || minor >= 2) return "-cl-std=CL1.2";
    if (minor == 1) return "-cl-std=CL1.1";
    return "";
}

// --- per-device runtime ---------------------------------------------------------------

// Context, in-order queue and program cache of one device, shared by every
// backend created for it. Deliberately never destroyed (see runtime_for).
class DeviceRuntime {
public:
    explicit DeviceRuntime(const DeviceInfo& info) : info_(info), std_option_(cl_std_option(info.opencl_c)) {
        const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(info.platform),
                                               0};
        context_ = ClContext(KVCL_CREATE(clCreateContext, props, 1, &info.id, nullptr, nullptr));
        queue_ = ClQueue(KVCL_CREATE(clCreateCommandQueue, context_.get(), info.id, 0));
    }

    cl_context context() const { return context_.get(); }
    cl_command_queue queue() const { return queue_.get(); }

    // The program of kernels/opencl/<file>, prelude (common.cl) first, built
    // with `defines`; compiled on first use, then cached.
    cl_program program(std::string_view file, const std::string& defines) {
        const std::string key = fmt::format("{}|{}", file, defines);
        const std::lock_guard lock(mutex_);
        auto it = programs_.find(key);
        if (it == programs_.end()) {
            const std::string_view prelude = opencl_embedded::kernel_source("common.cl");
            const std::string_view body = opencl_embedded::kernel_source(file);
            KVASIR_CHECK(!prelude.empty() && !body.empty(), ErrorCode::internal,
                         "opencl: kernel source '{}' is not embedded in this binary (have: {})", file,
                         opencl_embedded::kernel_names());
            std::string source = fmt::format("{}\n#line 1\n{}", prelude, body);
            it = programs_.emplace(key, build(fmt::format("kernels/opencl/{}", file), source, defines)).first;
        }
        return it->second.get();
    }

    // Uncached build; Error(backend_failure) with the build log on failure.
    ClProgram build(std::string_view what, const std::string& source, std::string_view options) const {
        const char* text = source.c_str();
        const std::size_t length = source.size();
        ClProgram program(KVCL_CREATE(clCreateProgramWithSource, context_.get(), 1, &text, &length));
        const std::string opts = std_option_ + (options.empty() ? "" : " ") + std::string(options);
        const cl_int err = clBuildProgram(program.get(), 1, &info_.id, opts.c_str(), nullptr, nullptr);
        if (err != CL_SUCCESS) {
            std::string log;
            std::size_t n = 0;
            if (clGetProgramBuildInfo(program.get(), info_.id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n) == CL_SUCCESS &&
                n > 0) {
                log.resize(n);
                if (clGetProgramBuildInfo(program.get(), info_.id, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr) !=
                    CL_SUCCESS)
                    log = "(build log unavailable)";
            }
            fail(ErrorCode::backend_failure,
                 "opencl: building {} for {} failed with {} ({}), options '{}'; build log (first 40 lines):\n{}", what,
                 info_.label(), cl_error_name(err), err, opts, first_lines(trimmed(std::move(log)), 40));
        }
        return program;
    }

private:
    const DeviceInfo& info_;
    std::string std_option_;
    ClContext context_;
    ClQueue queue_;
    std::mutex mutex_;
    std::map<std::string, ClProgram> programs_;
};

// One runtime per device for the life of the process. Intentionally leaked:
// releasing CL objects from static destructors races the ICD's and the
// driver's own teardown at exit (a known crash source with several ICDs).
DeviceRuntime& runtime_for(const DeviceInfo& info) {
    static std::mutex mutex;
    static auto* runtimes = new std::map<cl_device_id, std::unique_ptr<DeviceRuntime>>();
    const std::lock_guard lock(mutex);
    auto& slot = (*runtimes)[info.id];
    if (!slot) slot = std::make_unique<DeviceRuntime>(info);
    return *slot;
}

// An op's result left on the device (issue #38; core/tensor.hpp): the
// node's buffer in its storage format, immutable, read back on the first
// host read — a blocking read on the device's in-order queue, so after the
// kernel that wrote it; half buffers widen to f32 exactly, as download() does.
class ClResident final : public DeviceCopy {
public:
    // half: the buffer holds half bits (a storage=f16 node's activation).
    // carried: f32 values never rounded to storage (a Gated DeltaNet state),
    // not an activation in the node's storage format.
    ClResident(std::shared_ptr<NodeShared> node, cl_command_queue queue, PooledMem buffer, std::int64_t numel, bool half,
               bool carried = false)
        : DeviceCopy(DType::f32, numel), node_(std::move(node)), queue_(queue), buffer_(std::move(buffer)), half_(half),
          carried_(carried) {}

    const NodeShared* node() const { return node_.get(); }
    cl_mem get() const { return buffer_.get(); }
    bool carried() const { return carried_; }

private:
    void fetch(void* dst) const override {
        const std::size_t n = static_cast<std::size_t>(numel()), bytes = n * (half_ ? 2 : 4);
        std::vector<std::uint16_t> halves(half_ ? n : 0);
        const std::lock_guard lock(node_->mutex);
        KVCL_CHECK(clEnqueueReadBuffer(queue_, buffer_.get(), CL_TRUE, 0, bytes, half_ ? static_cast<void*>(halves.data()) : dst,
                                       0, nullptr, nullptr));
        ++node_->transfers.downloads;
        node_->waited();
        node_->transfers.download_bytes += bytes;
        if (half_)
            for (std::size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = f16_bits_to_f32(halves[i]);
    }

    std::shared_ptr<NodeShared> node_;  // declared first: outlives the buffer, which goes back to its pool
    cl_command_queue queue_;            // the device runtime's: never destroyed
    PooledMem buffer_;
    bool half_;
    bool carried_;
};

// An op's device input: a buffer uploaded for the op (from the pool) or a
// reference to a buffer already on the device (one of the node's results).
class DeviceArg {
public:
    DeviceArg() = default;
    explicit DeviceArg(PooledMem owned) : owned_(std::move(owned)) {}
    explicit DeviceArg(ClMem reference) : reference_(std::move(reference)) {}
    cl_mem get() const { return owned_.get() != nullptr ? owned_.get() : reference_.get(); }

private:
    PooledMem owned_;
    ClMem reference_;
};

const DeviceInfo& device_at(int index, std::string_view spec) {
    const Enumeration& e = devices();
    if (e.devices.empty()) fail(ErrorCode::unsupported, "backend '{}' is absent: {}", spec, e.reason);
    if (index < 0 || index >= static_cast<int>(e.devices.size())) {
        std::string list;
        for (const DeviceInfo& d : e.devices) list += fmt::format("{}opencl:{} = {}", list.empty() ? "" : ", ", d.index, d.label());
        fail(ErrorCode::bad_input, "backend '{}': no OpenCL device {} (available: {})", spec, index, list);
    }
    return e.devices[static_cast<std::size_t>(index)];
}

// KV_WN of matmul.cl: outputs per work-item along n (independent fma chains).
constexpr std::size_t kMatmulOutputsPerItem = 8;
// kv_matmul_packed's panels: 16 outputs, k-major; their weight-cache layout tag.
constexpr std::int64_t kPanel = 16;
constexpr std::uint32_t kPackedLayout = 1;

std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

std::size_t floor_pow2(std::size_t n) {
    std::size_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

// --- the backend ------------------------------------------------------------------------

class OpenclBackend final : public Backend {
public:
    explicit OpenclBackend(const BackendSpec& spec) {
        std::optional<std::uint64_t> cache_budget;
        for (const auto& [key, value] : spec.options) {
            if (key == "weight_cache") {
                cache_budget = parse_weight_cache_option(spec, value);
            } else if (key == "resident") {
                KVASIR_CHECK(value == "0" || value == "1", ErrorCode::bad_input,
                             "backend '{}': resident={} (0: every result comes back to the host, 1: a forward pass's "
                             "results stay on the device)", spec.canonical(), value);
                resident_ = value == "1";
            } else if (key == "async_uploads") {
                KVASIR_CHECK(value == "0" || value == "1", ErrorCode::bad_input,
                             "backend '{}': async_uploads={} (1: a forward pass's uploads do not wait; 0: they do)",
                             spec.canonical(), value);
                async_uploads_ = value == "1";
            } else if (!apply_precision_option(spec, key, value, caps_)) {
                fail(ErrorCode::bad_input,
                     "backend '{}': unknown option '{}' (opencl takes storage=, acc=, weight_cache=, resident=)",
                     spec.canonical(), key);
            }
        }
        info_ = &device_at(spec.device, spec.canonical());
        shared_->pool = std::make_unique<DevicePool>(default_device_pool_cap(info_->global_mem), release_cl_buffer);
        weights_ = std::make_unique<WeightCache<ClMem>>(cache_budget.value_or(default_weight_cache_budget(info_->global_mem)));
        if (caps_.accumulation == DType::f16 && !info_->fp16)
            fail(ErrorCode::unsupported,
                 "backend '{}': device {} has no cl_khr_fp16, so it cannot accumulate in half (storage=f16 works: "
                 "half buffers need no extension)",
                 spec.canonical(), info_->label());

        // Work-group shapes are fixed per device so results never depend on
        // the runtime's choice: 16×16 matmul tiles where 256 work-items fit.
        const auto tile_fits = [&](std::size_t t) {
            return info_->max_work_group >= t * t && info_->max_work_item[0] >= t && info_->max_work_item[1] >= t;
        };
        tile_ = tile_fits(16) ? 16 : tile_fits(8) ? 8 : 4;
        row_wg_ = floor_pow2(std::min<std::size_t>({256, info_->max_work_group, info_->max_work_item[0]}));
        elem_wg_ = std::min<std::size_t>(64, row_wg_);
        defines_ = fmt::format(
            "-DKV_STORAGE_HALF={} -DKV_STORAGE_BF16={} -DKV_ACC_HALF={} -DKV_TILE={} -DKV_WN={} -DKV_ROW_WG={}",
            caps_.storage == DType::f16 ? 1 : 0, caps_.storage == DType::bf16 ? 1 : 0,
            caps_.accumulation == DType::f16 ? 1 : 0, tile_, kMatmulOutputsPerItem, row_wg_);
        runtime_ = &runtime_for(*info_);
        BackendSpec canonical;
        canonical.name = "opencl";
        canonical.device = info_->index;
        canonical.device_given = true;
        if (caps_.storage != DType::f32) canonical.options["storage"] = dtype_name(caps_.storage);
        if (caps_.accumulation != DType::f32) canonical.options["acc"] = dtype_name(caps_.accumulation);
        // Kept in the name when given, so a child process of the audit gets it too.
        if (cache_budget) canonical.options["weight_cache"] = std::to_string(*cache_budget >> 20);
        if (!resident_) canonical.options["resident"] = "0";  // the results' bits are the same either way
        if (!async_uploads_) canonical.options["async_uploads"] = "0";
        caps_.node = canonical.canonical();
        caps_.backend = "opencl";
        caps_.device = info_->name;
        caps_.runtime = fmt::format("{} ({}), driver {}, {}", info_->platform_name, info_->platform_version,
                                    info_->driver, info_->opencl_c);
        caps_.output = DType::f32;
        caps_.fma = true;  // fma() explicit in matmul, rmsnorm and Gated DeltaNet; FP_CONTRACT OFF elsewhere
        caps_.threads = static_cast<int>(info_->compute_units);
        caps_.deterministic = true;
        caps_.extra = {
            {"platform", fmt::format("{} ({})", info_->platform_name, info_->platform_version)},
            {"vendor", info_->vendor},
            {"driver", info_->driver},
            {"opencl_c", info_->opencl_c},
            {"cl_khr_fp16", info_->fp16 ? "yes" : "no"},
            {"cl_khr_fp64", info_->fp64 ? "yes" : "no"},
            {"compute_units", std::to_string(info_->compute_units)},
            {"kernels", fmt::format("{3}; softmax/rmsnorm one {2}-wide "
                                    "work-group tree per row; causal conv1d one work-item per (t, c); gated "
                                    "delta rule one {2}-wide work-group per value head, tokens in sequence, "
                                    "f32 state in global memory; causal attention {4} over its visible keys, "
                                    "probabilities in local memory",
                                    tile_, tile_ * kMatmulOutputsPerItem, row_wg_,
                                    caps_.accumulation == DType::f32
                                        ? "matmul on weights kept in 16-output k-major panels (the narrowest exact "
                                          "format: f32, half or bf16), a work-item per 1/2/4/8 rows x one panel, "
                                          "one fma chain per output"
                                        : fmt::format("matmul {0}x{1} output tiles by {0}x{0} work-groups in local "
                                                      "memory (TILE_K {0}), one fma chain per output",
                                                      tile_, tile_ * kMatmulOutputsPerItem),
                                    panel_attention()
                                        ? fmt::format("one work-item per (query row, head) on keys in 16-key panels, "
                                                      "16 fma chains per vector, the softmax trees of a {}-wide "
                                                      "work-group walked in order (head dims not a multiple of 16: "
                                                      "one {}-wide work-group per row)", row_wg_, row_wg_)
                                        : fmt::format("one {}-wide work-group per (query row, head)", row_wg_))},
            {"fp_contract", "off; fma() explicit in matmul, rmsnorm, causal conv1d and the gated delta rule"},
            {"storage_format", caps_.storage == DType::f16    ? "half buffers (vload_half/vstore_half_rte)"
                               : caps_.storage == DType::bf16 ? "f32 buffers of bf16 values (host rounds inputs, kernels round stores)"
                                                              : "f32 buffers"},
            {"build_options", fmt::format("{} {}", cl_std_option(info_->opencl_c), defines_)},
            {"resident", resident_ ? "a forward pass's results stay on the device; the host reads back what it uses"
                                   : "off (resident=0): every result is read back after its op"},
            {"async_uploads", async_uploads_ ? "on: a forward pass's uploads do not wait (their bytes are kept until the queue's next wait)"
                                              : "off (async_uploads=0): every upload waits for its copy"},
            {"weight_cache", describe_weight_cache(weights_->stats().budget_bytes, cache_budget.has_value(),
                                                   "CL_DEVICE_GLOBAL_MEM_SIZE")},
        };
    }

    // Writes still in flight read NodeShared::in_flight, which may go with
    // the node: they finish first (the queue is the device's, shared).
    ~OpenclBackend() override {
        if (runtime_ == nullptr) return;
        const std::lock_guard lock(shared_->mutex);
        if (shared_->in_flight.empty()) return;
        (void)clFinish(runtime_->queue());
        shared_->in_flight.clear();
    }

    const Capabilities& capabilities() const override { return caps_; }
    std::optional<WeightCacheStats> weight_cache_stats() const override { return weights_->stats(); }
    std::optional<TransferStats> transfer_stats() const override {
        const std::lock_guard lock(shared_->mutex);
        return shared_->transfers;
    }

    Tensor matmul(const TensorView& x, const TensorView& w) override {
        check_matmul_args(x, w);
        const std::int64_t t_count = rows_of(x), n_count = w.dim(0), k_count = w.dim(1);
        Shape shape = x.shape;
        shape.back() = n_count;
        check_int_range("matmul", {t_count, n_count, k_count});
        if (t_count == 0 || n_count == 0 || k_count == 0) return Tensor(DType::f32, shape);  // empty sums are +0
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        PooledMem yb = output(t_count * n_count);
        enqueue_matmul(xb, t_count, w, yb);
        return result(std::move(yb), shape);
    }

    // y [t, N] = x [t, K] · wᵀ, both on the device in its storage format: the
    // weight from the node's cache, nothing else moved. The caller holds the lock.
    template <class XBuffer, class YBuffer>
    void enqueue_matmul(const XBuffer& xb, std::int64_t t_count, const TensorView& w, const YBuffer& yb) {
        const std::int64_t n_count = w.dim(0), k_count = w.dim(1);
        if (caps_.accumulation == DType::f32) {
            // kv_matmul_packed_R: R rows of x per work-item, 16 outputs of one panel.
            const int rows = t_count >= 8 ? 8 : t_count >= 3 ? 4 : static_cast<int>(t_count);
            const ClMem wb = packed_weight(w);
            const cl_kernel k =
                kernel("matmul.cl", fmt::format("kv_matmul_packed{}_{}", rows, dtype_name(panel_format(w.dtype))).c_str(), 1);
            set_args(k, xb, wb, yb, static_cast<cl_int>(t_count), static_cast<cl_int>(n_count),
                     static_cast<cl_int>(k_count));
            const std::size_t global[2] = {static_cast<std::size_t>((t_count + rows - 1) / rows),
                                           static_cast<std::size_t>((n_count + kPanel - 1) / kPanel)};
            const std::size_t local[2] = {1, 1};
            enqueue(k, 2, global, local);
            return;
        }
        const ClMem wb = weight(w);
        const cl_kernel k = kernel("matmul.cl", "kv_matmul", tile_ * tile_);
        set_args(k, xb, wb, yb, static_cast<cl_int>(t_count), static_cast<cl_int>(n_count),
                 static_cast<cl_int>(k_count));
        // Work-items along n cover kMatmulOutputsPerItem outputs each.
        const std::size_t global[2] = {round_up(static_cast<std::size_t>(n_count), tile_ * kMatmulOutputsPerItem) /
                                           kMatmulOutputsPerItem,
                                       round_up(static_cast<std::size_t>(t_count), tile_)};
        const std::size_t local[2] = {tile_, tile_};
        enqueue(k, 2, global, local);
    }

    // y[i] = kernel(x[i], extra…) of elementwise.cl over n elements.
    template <class... Extra>
    Tensor unary_elementwise(const char* name, const TensorView& x, Extra... extra) {
        const std::int64_t n = x.numel();
        if (n == 0) return Tensor(DType::f32, x.shape);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        PooledMem yb = output(n);
        const cl_kernel k = kernel("elementwise.cl", name, 0);
        set_args(k, xb, yb, static_cast<cl_ulong>(n), extra...);
        launch_1d(k, n);
        return result(std::move(yb), x.shape);
    }

    // y[i] = kernel(a[i], b[i], extra…) of elementwise.cl over n elements.
    template <class... Extra>
    Tensor binary_elementwise(const char* name, const TensorView& a, const TensorView& b, Extra... extra) {
        const std::int64_t n = a.numel();
        if (n == 0) return Tensor(DType::f32, a.shape);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg ab = upload(a), bb = upload(b);
        PooledMem yb = output(n);
        enqueue_binary(name, ab.get(), bb.get(), yb.get(), n, extra...);
        return result(std::move(yb), a.shape);
    }
    template <class... Extra>
    void enqueue_binary(const char* name, const cl_mem ab, const cl_mem bb, const cl_mem yb, std::int64_t n,
                        Extra... extra) {
        const cl_kernel k = kernel("elementwise.cl", name, 0);
        set_args(k, ab, bb, yb, static_cast<cl_ulong>(n), extra...);
        launch_1d(k, n);
    }

    // A MoE block's experts on the device (issue #38): the jobs' token rows
    // go up in one buffer, every expert's gate, up, (clamped) SwiGLU and down
    // run on regions of device buffers with the very kernels matmul and
    // swiglu run — so each y has the default's bits (the intermediates are
    // stored in the device's format either way, and the default's download
    // and re-upload of them round nothing) — and all outputs come back in one
    // read: one upload and one download per block instead of five per expert.
    // Experts with biases (gpt-oss) add them with add's kernel on f32
    // storage (device_biases); on narrower storage they take the default.
    void expert_ffns(std::span<ExpertJob> jobs) override {
        std::vector<const ExpertWeights*> weights;
        std::vector<std::int64_t> rows;
        for (const ExpertJob& j : jobs) {
            if (!device_biases(*j.weights)) return Backend::expert_ffns(jobs);
            weights.push_back(j.weights);
            rows.push_back(rows_of(j.x));
            check_matmul_args(j.x, j.weights->gate);
            check_matmul_args(j.x, j.weights->up);
        }
        const ExpertLayout layout = lay_out(weights, rows, jobs.empty() ? 0 : jobs.front().x.shape().back());
        if (layout.empty()) return Backend::expert_ffns(jobs);
        const std::lock_guard lock(shared_->mutex);
        const std::size_t eb = storage_bytes();
        const PooledMem xb = upload_pooled(layout.x_total * eb, [&](std::byte* host) {
            for (std::size_t n = 0; n < jobs.size(); ++n) to_device_format(jobs[n].x.view(), host + layout.slices[n].x * eb);
        });
        const PooledMem yb = enqueue_experts(xb, weights, layout);
        const Tensor all = download(yb, {static_cast<std::int64_t>(layout.y_total)});
        for (std::size_t n = 0; n < jobs.size(); ++n) {
            const ExpertSlice& r = layout.slices[n];
            jobs[n].y = Tensor(DType::f32, {r.rows, r.out});
            std::memcpy(jobs[n].y.raw(), all.as<float>() + r.y, jobs[n].y.nbytes());
        }
    }

    // The whole MoE block on the device, inside a DeviceResidency scope: the
    // routed tokens' rows gathered into the experts' regions (kv_moe_gather:
    // data movement), the experts as expert_ffns runs them, and the combine
    // (kv_moe_combine) — out[t] = Σ w·y over the token's experts in ascending
    // expert id, each product and sum rounded to f32 from +0, then to storage:
    // the default's moe_combine<float> to the bit. The plan's tables go up in
    // one buffer; nothing comes back. Experts whose biases the device cannot
    // add (device_biases), and calls outside a scope, take the default
    // (gather and combine on the host).
    Tensor moe_block(const TensorView& x, std::span<const ExpertWeights> experts, const RoutingPlan& plan,
                     const std::vector<bool>* expert_filter = nullptr) override {
        if (!resident_ || !DeviceResidency::active() || caps_.output != DType::f32 ||
            !std::all_of(experts.begin(), experts.end(), [&](const ExpertWeights& ew) { return device_biases(ew); }))
            return Backend::moe_block(x, experts, plan, expert_filter);
        const std::vector<ExpertRows> routed = route_rows(x, experts, plan, expert_filter);
        const std::int64_t t_count = x.dim(0), h = x.dim(1);
        const RoutedExperts chosen = routed_experts(experts, routed, h);
        const ExpertLayout layout = lay_out(chosen.weights, chosen.rows, h);
        if (layout.empty()) return Backend::moe_block(x, experts, plan, expert_filter);
        const std::vector<std::uint32_t> table = moe_device_table(routed, layout.x_rows(), layout.y_rows(), t_count);
        const std::size_t g_count = chosen.g_count;
        check_int_range("moe", {static_cast<std::int64_t>(table.size())});
        const std::lock_guard lock(shared_->mutex);
        const std::size_t eb = storage_bytes();
        const DeviceArg xin = upload(x);
        const ClMem tb = upload_raw(table.data(), table.size() * sizeof(std::uint32_t));
        const PooledMem xb = device_buffer(layout.x_total * eb);
        const cl_kernel gk = kernel("elementwise.cl", "kv_moe_gather", 0);
        set_args(gk, xin, tb, xb, static_cast<cl_uint>(g_count), static_cast<cl_uint>(h));
        launch_1d(gk, static_cast<std::int64_t>(g_count) * h);
        const PooledMem yb = enqueue_experts(xb, chosen.weights, layout);
        PooledMem ob = output(t_count * h);
        const cl_kernel ck = kernel("elementwise.cl", "kv_moe_combine", 0);
        set_args(ck, yb, tb, ob, static_cast<cl_uint>(g_count), static_cast<cl_uint>(t_count), static_cast<cl_uint>(h));
        launch_1d(ck, t_count * h);
        return result(std::move(ob), {t_count, h});
    }

    Tensor swiglu(const TensorView& gate, const TensorView& up) override {
        check_same_shape("swiglu", gate, up);
        return binary_elementwise("kv_swiglu", gate, up);
    }

    Tensor clamped_swiglu(const TensorView& gate, const TensorView& up, double alpha, double limit) override {
        check_clamped_swiglu_args(gate, up, alpha, limit);
        return binary_elementwise("kv_clamped_swiglu", gate, up, static_cast<cl_float>(alpha), static_cast<cl_float>(limit));
    }

    // add / mul / scale: the default's bits (kv_add/kv_mul/kv_scale in
    // elementwise.cl say why) on the device, so that a residual stream or a
    // gated output stays there. mul and scale round their operands to storage
    // first, as the upload does; add reads them as they are, so it runs here
    // when every operand is already in the storage format: one of this node's
    // results, or any f32/f16/bf16 tensor on an f32 node (exactly widened);
    // else the default on the host.
    Tensor add(const TensorView& a, const TensorView& b) override {
        check_same_shape("add", a, b);
        const auto exact = [&](const TensorView& v) {
            return ours(v) != nullptr ||
                   (caps_.storage == DType::f32 && (v.dtype == DType::f32 || v.dtype == DType::f16 || v.dtype == DType::bf16));
        };
        if (!exact(a) || !exact(b)) return Backend::add(a, b);
        return binary_elementwise("kv_add", a, b);
    }
    Tensor mul(const TensorView& a, const TensorView& b) override {
        check_same_shape("mul", a, b);
        return binary_elementwise("kv_mul", a, b);
    }
    Tensor scale(const TensorView& x, double s) override { return unary_elementwise("kv_scale", x, static_cast<cl_float>(s)); }

    // A layer's KV cache on the device (Backend::kv_rows), inside a
    // DeviceResidency scope: kv_cache_rows moves the kept rows and the new
    // ones into the next cache buffer — nothing crosses to the host.
    std::optional<Tensor> kv_rows(const TensorView* cache, std::int64_t keep, const TensorView& rows) override {
        if (!resident_ || !DeviceResidency::active()) return std::nullopt;
        KVASIR_CHECK(rows.rank() == 3 && (cache == nullptr ? keep == 0
                                                           : cache->rank() == 3 && cache->dim(0) == rows.dim(1) &&
                                                                 cache->dim(2) == rows.dim(2) && keep <= cache->dim(1)),
                     ErrorCode::internal, "kv_rows: cache {} keeping {} rows, new rows {}",
                     cache != nullptr ? shape_str(cache->shape) : "none", keep, shape_str(rows.shape));
        const std::int64_t heads = rows.dim(1), t_count = rows.dim(0), d = rows.dim(2), s_out = keep + t_count;
        const std::int64_t s_cache = cache != nullptr ? cache->dim(1) : 0;
        check_int_range("kv_rows", {heads * s_out * d, heads * s_cache * d});
        if (heads * s_out * d == 0) return Tensor(DType::f32, {heads, s_out, d});
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg rb = upload(rows);
        const DeviceArg cb = cache != nullptr && keep > 0 ? upload(*cache) : DeviceArg();
        PooledMem yb = output(heads * s_out * d);
        const cl_kernel k = kernel("elementwise.cl", "kv_cache_rows", 0);
        set_args(k, cb.get() != nullptr ? cb.get() : rb.get(), rb, yb, static_cast<cl_int>(heads), static_cast<cl_int>(s_cache),
                 static_cast<cl_int>(keep), static_cast<cl_int>(t_count), static_cast<cl_int>(d));
        launch_1d(k, heads * s_out * d);
        return result(std::move(yb), {heads, s_out, d});
    }

    // Data movement (Backend::copy_columns, last_rows, join_columns,
    // repeat_columns) of this node's own results inside a DeviceResidency
    // scope: kv_copy_block, block by block (backend.hpp BlockCopy); anything
    // else takes the default (a host copy).
    bool moves_here(std::initializer_list<const TensorView*> in) const {
        return resident_ && DeviceResidency::active() &&
               std::all_of(in.begin(), in.end(), [&](const TensorView* v) { return v == nullptr || ours(*v) != nullptr; });
    }
    using Backend::copy_columns;
    Tensor copy_columns(const TensorView& x, std::int64_t c0, std::int64_t n, std::int64_t step) override {
        check_copy_columns_args(x, c0, n, step);
        if (!moves_here({&x})) return Backend::copy_columns(x, c0, n, step);
        const std::int64_t rows = rows_of(x);
        check_int_range("copy_columns", {x.numel(), rows * n});
        const std::lock_guard lock(shared_->mutex);
        PooledMem yb = output(rows * n);
        if (rows * n > 0) copy_block(upload(x).get(), yb.get(), copy_columns_block(x, c0, n, step));
        return result(std::move(yb), {rows, n});
    }
    Tensor last_rows(const TensorView* prev, const TensorView& x, std::int64_t n) override {
        check_last_rows_args(prev, x, n);
        if (!moves_here({prev, &x})) return Backend::last_rows(prev, x, n);
        const std::int64_t cols = x.dim(1);
        check_int_range("last_rows", {x.numel(), n * cols});
        const std::lock_guard lock(shared_->mutex);
        PooledMem yb = output(n * cols);
        const std::array<BlockCopy, 2> blocks = last_rows_blocks(prev, x, n);
        if (prev == nullptr) fill_zero(yb, static_cast<std::size_t>(blocks[0].y_r0 * cols) * storage_bytes());
        copy_block(upload(x).get(), yb.get(), blocks[0]);
        if (prev != nullptr) copy_block(upload(*prev).get(), yb.get(), blocks[1]);
        return result(std::move(yb), {n, cols});
    }
    Tensor join_columns(std::span<const TensorView> parts) override {
        const std::int64_t cols = check_join_columns_args(parts), rows = rows_of(parts.front());
        if (!resident_ || !DeviceResidency::active() ||
            !std::all_of(parts.begin(), parts.end(), [&](const TensorView& p) { return zero_part(p) || ours(p) != nullptr; }))
            return Backend::join_columns(parts);
        check_int_range("join_columns", {rows * cols});
        const std::lock_guard lock(shared_->mutex);
        PooledMem yb = output(rows * cols);
        if (std::any_of(parts.begin(), parts.end(), zero_part))
            fill_zero(yb, static_cast<std::size_t>(rows * cols) * storage_bytes());
        const std::vector<BlockCopy> blocks = join_columns_blocks(parts);
        for (std::size_t i = 0; i < parts.size(); ++i)
            if (!zero_part(parts[i]) && blocks[i].rows * blocks[i].n > 0) copy_block(upload(parts[i]).get(), yb.get(), blocks[i]);
        return result(std::move(yb), {rows, cols});
    }
    Tensor repeat_columns(const TensorView& x, std::int64_t times) override {
        check_repeat_columns_args(x, times);
        if (!moves_here({&x})) return Backend::repeat_columns(x, times);
        const std::int64_t rows = rows_of(x), cols = times * x.shape.back();
        check_int_range("repeat_columns", {x.numel(), rows * cols});
        const std::lock_guard lock(shared_->mutex);
        PooledMem yb = output(rows * cols);
        if (rows * cols > 0) copy_block(upload(x).get(), yb.get(), repeat_columns_block(x, times));
        return result(std::move(yb), {rows, cols});
    }

    Tensor sigmoid(const TensorView& x) override { return unary_elementwise("kv_sigmoid", x); }

    Tensor softmax(const TensorView& x) override {
        KVASIR_CHECK(x.rank() >= 1, ErrorCode::bad_input, "softmax: scalar input");
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        check_int_range("softmax", {rows, cols});
        if (rows == 0 || cols == 0) return Tensor(DType::f32, x.shape);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        PooledMem yb = output(rows * cols);
        const cl_kernel k = kernel("rows.cl", "kv_softmax", row_wg_);
        set_args(k, xb, yb, static_cast<cl_int>(cols));
        launch_narrow_rows(k, rows, cols);
        return result(std::move(yb), x.shape);
    }

    Tensor rmsnorm(const TensorView& x, const TensorView& weight, double eps) override {
        check_rmsnorm_args(x, weight);
        const std::int64_t cols = x.dim(-1), rows = rows_of(x);
        check_int_range("rmsnorm", {rows, cols});
        if (rows == 0 || cols == 0) return Tensor(DType::f32, x.shape);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        const ClMem wb = this->weight(weight);
        PooledMem yb = output(rows * cols);
        const cl_kernel k = kernel("rows.cl", "kv_rmsnorm", row_wg_);
        set_args(k, xb, wb, yb, static_cast<cl_int>(cols), static_cast<cl_float>(eps));
        launch_narrow_rows(k, rows, cols);
        return result(std::move(yb), x.shape);
    }

    Tensor rope(const TensorView& x, std::span<const std::int64_t> positions, const RopeParams& params) override {
        check_rope_args(x, positions, params);
        const std::int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2);
        check_int_range("rope", {t_count, heads, d});
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        // Positions cross as f32, the type the angle is computed in (exact up
        // to 2^24, which no context length reaches).
        std::vector<cl_float> pos(positions.size());
        for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<cl_float>(positions[i]);
        // A scaled rope's inverse frequencies cross as f32 (rope_inv_freq_f32);
        // the plain rope's are computed on the device once per (theta, d).
        std::vector<cl_float> freq;
        if (params.inv_freq) {
            freq.resize(static_cast<std::size_t>(d / 2));
            for (std::int64_t i = 0; i < d / 2; ++i) freq[static_cast<std::size_t>(i)] = rope_inv_freq_f32(params, i, d);
        }
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        // Positions and a scaled rope's frequencies go up once while they
        // stay the same (every layer of a step, q and k): one upload a step.
        const cl_mem pb = same_upload(rope_positions_, pos);
        const cl_mem fb = params.inv_freq ? same_upload(rope_scaled_, freq) : rope_table(d, static_cast<cl_float>(params.theta));
        PooledMem yb = output(x.numel());
        const cl_kernel k = kernel("elementwise.cl", "kv_rope", 0);
        set_args(k, xb, yb, pb, fb, static_cast<cl_int>(heads), static_cast<cl_int>(d),
                 static_cast<cl_int>(params.layout == RopeLayout::neox ? 1 : 0));
        const std::size_t global[3] = {static_cast<std::size_t>(d / 2), static_cast<std::size_t>(heads),
                                       static_cast<std::size_t>(t_count)};
        enqueue(k, 3, global, nullptr);
        return result(std::move(yb), x.shape);
    }

    // Gated DeltaNet (kernels/opencl/linear_attention.cl). The host checks
    // shapes and moves data; every arithmetic operation is the kernels'.
    Tensor causal_conv1d_silu(const TensorView& x, const TensorView& w, const TensorView* history) override {
        check_conv1d_args(x, w, history);
        const std::int64_t t_count = x.dim(0), c_count = x.dim(1), k_count = w.shape.back();
        check_int_range("causal_conv1d_silu", {t_count, c_count, k_count, t_count * c_count});
        if (x.numel() == 0) return Tensor(DType::f32, x.shape);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg xb = upload(x);
        const ClMem wb = weight(w);
        // No history: the kernel reads zeros and never touches the buffer
        // bound in its place (x itself).
        const DeviceArg hb = history != nullptr && history->numel() > 0 ? upload(*history) : DeviceArg();
        PooledMem yb = output(x.numel());
        const cl_kernel k = kernel("linear_attention.cl", "kv_causal_conv1d_silu", 0);
        set_args(k, xb, wb, hb.get() != nullptr ? hb : xb, yb, static_cast<cl_int>(t_count), static_cast<cl_int>(c_count),
                 static_cast<cl_int>(k_count), static_cast<cl_int>(history != nullptr ? 1 : 0));
        launch_1d(k, x.numel());
        return result(std::move(yb), x.shape);
    }

    GatedDeltaResult gated_delta_rule(const GatedDeltaInputs& in) override {
        check_gated_delta_args(in);
        const std::int64_t t_count = in.q.dim(0), nk = in.q.dim(1), dk = in.q.dim(2), nv = in.v.dim(1), dv = in.v.dim(2);
        check_int_range("gated_delta_rule", {t_count, nk, dk, nv, dv, t_count * nv * dv, nv * dk * dv});
        GatedDeltaResult res{Tensor(DType::f32, {t_count, nv, dv}), Tensor(DType::f32, {nv, dk, dv})};
        if (nv == 0 || dk == 0 || dv == 0) return res;  // no state: out is empty sums, +0
        if (t_count == 0) {  // no tokens: the state passes through (as f32, like every state this op returns)
            if (in.state != nullptr) res.state = Tensor::convert(*in.state, DType::f32);
            return res;
        }
        // q and k of one token in local memory, plus the two l2norm trees.
        const std::size_t local_bytes = static_cast<std::size_t>(2 * dk) * sizeof(cl_float);
        KVASIR_CHECK(local_bytes + 2 * row_wg_ * sizeof(cl_float) <= info_->local_mem, ErrorCode::unsupported,
                     "gated_delta_rule: key head dim {} needs {} bytes of local memory, {} has {}", dk,
                     local_bytes + 2 * row_wg_ * sizeof(cl_float), info_->label(), info_->local_mem);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg qb = upload(in.q), kb = upload(in.k), vb = upload(in.v), ab = upload(in.a), bb = upload(in.b);
        const ClMem alb = weight(in.a_log), dtb = weight(in.dt_bias);
        // The state is f32 in every storage variant (the op's own carried
        // result, not a stored activation): uploaded exactly when it is f32.
        const std::size_t state_bytes = static_cast<std::size_t>(res.state.numel()) * sizeof(cl_float);
        ClMem sin;
        const auto* kept = in.state != nullptr ? dynamic_cast<const ClResident*>(in.state->device) : nullptr;
        if (kept != nullptr && kept->node() == shared_.get() && kept->carried() && in.state->device_offset == 0 &&
            kept->numel() == res.state.numel()) {  // the state this node left on the device: read where it is
            KVCL_CHECK(clRetainMemObject(kept->get()));
            sin = ClMem(kept->get());
        } else if (in.state != nullptr) {
            if (in.state->dtype == DType::f32) {
                sin = upload_raw(in.state->host_data(), state_bytes);
            } else {
                const Tensor f = Tensor::convert(*in.state, DType::f32);
                sin = upload_raw(f.raw(), state_bytes);
            }
        }
        PooledMem sb = device_buffer(state_bytes);
        PooledMem ob = output(res.out.numel());
        const cl_kernel k = kernel("linear_attention.cl", "kv_gated_delta_rule", row_wg_);
        set_args(k, qb, kb, vb, ab, bb, alb, dtb, in.state != nullptr ? sin.get() : sb.get(), sb, ob, static_cast<cl_int>(t_count),
                 static_cast<cl_int>(nk), static_cast<cl_int>(dk), static_cast<cl_int>(nv), static_cast<cl_int>(dv),
                 static_cast<cl_int>(in.state != nullptr ? 1 : 0), LocalBytes{local_bytes / 2}, LocalBytes{local_bytes / 2});
        const std::size_t global = static_cast<std::size_t>(nv) * row_wg_;
        enqueue(k, 1, &global, &row_wg_);
        if (resident_ && DeviceResidency::active()) {  // both stay: the next call reads the state where it is
            res.out = result(std::move(ob), res.out.shape());
            res.state = Tensor::on_device(res.state.shape(), std::make_shared<ClResident>(shared_, runtime_->queue(), std::move(sb),
                                                                                          res.state.numel(), false, true));
            return res;
        }
        res.out = download(ob, res.out.shape());  // read with the state below: one wait either way
        read(sb, state_bytes, res.state.raw());
        return res;
    }

private:
    // Fused causal attention (kernels/opencl/attention.cl): one work-group of
    // row_wg_ per (query row, head), the same bits as this node's composition.
    // On a CPU device with f32 accumulation and whole 16-wide vectors per head
    // (D a multiple of 16), kv_causal_attention_panels runs the chains 16 at a
    // time on keys the host lays out in panels (key_panels: exact data
    // movement); elsewhere kv_causal_attention on the kv heads stacked into
    // one [nkv, S, D] buffer. Head dims beyond the kernel's local q row take
    // the composition.
    // With sinks (gpt-oss): the same kernels, the head's sink joining the
    // softmax where the composition's widened row has it (attention.cl).
    Tensor run_attention(const TensorView& q, std::span<const TensorView> keys, std::span<const TensorView> values,
                         double scale, const TensorView* sinks) override {
        check_attention_args(q, keys, values);
        const std::int64_t t_count = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = static_cast<std::int64_t>(keys.size());
        const std::int64_t s_count = keys[0].dim(0);
        if (t_count == 0) return Tensor(DType::f32, {0, nh * d});
        if (d > kAttentionMaxDim || !one_dtype(keys) || !one_dtype(values))
            return compose_attention(q, keys, values, scale, sinks);
        check_int_range("causal_attention", {t_count * nh, nkv * ((s_count + kPanel - 1) / kPanel * kPanel) * d, t_count * nh * d});
        const bool panels = panel_attention() && d % kPanel == 0;
        // A device KV cache (Backend::kv_rows) is read where it is: its heads
        // are stacked already, and laid out in panels by kv_key_panels.
        const std::optional<TensorView> kr = consecutive_parts(keys), vr = consecutive_parts(values);
        const bool keys_here = kr && ours(*kr) != nullptr, values_here = vr && ours(*vr) != nullptr;
        const Tensor kc = keys_here ? Tensor() : panels ? key_panels(keys) : stacked(keys);
        const Tensor vc = values_here ? Tensor() : stacked(values);
        const std::lock_guard lock(shared_->mutex);
        const DeviceArg qb = upload(q), vb = upload(values_here ? *vr : vc.view());
        const DeviceArg kb = keys_here && panels ? key_panels_here(upload(*kr), nkv, s_count, d)
                                                 : upload(keys_here ? *kr : kc.view());
        const ClMem sb = sinks ? weight(*sinks) : ClMem();  // a model weight: resident after its first call
        const cl_mem sinks_mem = sinks ? sb.get() : qb.get();  // without sinks: any buffer, unread
        PooledMem ob = output(t_count * nh * d);
        const cl_kernel k = kernel("attention.cl", panels ? "kv_causal_attention_panels" : "kv_causal_attention",
                                   panels ? 1 : row_wg_);
        set_args(k, qb, kb, vb, ob, static_cast<cl_int>(t_count), static_cast<cl_int>(nh), static_cast<cl_int>(nkv),
                 static_cast<cl_int>(d), static_cast<cl_int>(s_count), static_cast<cl_float>(scale), sinks_mem,
                 static_cast<cl_int>(sinks ? 1 : 0));
        if (panels) {  // a work-item per (query row, head)
            const std::size_t global = static_cast<std::size_t>(t_count * nh), local = 1;
            enqueue(k, 1, &global, &local);
        } else {
            launch_rows(k, t_count * nh);
        }
        return result(std::move(ob), {t_count, nh * d});
    }

    // An expert's biases can be added on the device with the default's bits:
    // it has none, or the node stores f32 — where add's kernel runs on a host
    // bias as the default's add would (the add override's `exact`); on
    // narrower storage the default adds the unrounded bias on the host.
    bool device_biases(const ExpertWeights& ew) const {
        const bool biased = ew.has_biases();
        return !biased || caps_.storage == DType::f32;
    }
    // y (rows × cols, on the device) += the bias row, in place (kv_add_rows); absent bias: nothing.
    void add_bias(const ClMem& y, const TensorView& bias, std::int64_t rows, std::int64_t cols) {
        if (bias.data == nullptr || rows * cols == 0) return;
        const ClMem b = weight(bias);
        const cl_kernel k = kernel("elementwise.cl", "kv_add_rows", 0);
        set_args(k, y.get(), b.get(), y.get(), static_cast<cl_ulong>(rows * cols), static_cast<cl_ulong>(cols));
        launch_1d(k, rows * cols);
    }
    // The block's buffers laid out as backend.hpp lay_out_experts does, each
    // slice on the device's base alignment (it is bound as a sub-buffer).
    ExpertLayout lay_out(std::span<const ExpertWeights* const> weights, std::span<const std::int64_t> rows,
                         std::int64_t h) const {
        return lay_out_experts(weights, rows, h, std::max<std::size_t>(1, info_->base_align_bytes / storage_bytes()));
    }
    // Every expert's gate, up, (clamped) SwiGLU and down on its region of xb,
    // with matmul's and swiglu's kernels; returns the y buffer. Under the lock.
    PooledMem enqueue_experts(const PooledMem& xb, std::span<const ExpertWeights* const> weights, const ExpertLayout& layout) {
        const std::size_t eb = storage_bytes();
        const PooledMem gb = device_buffer(layout.mid_total * eb), ub = device_buffer(layout.mid_total * eb),
                        ab = device_buffer(layout.mid_total * eb);
        PooledMem yb = device_buffer(layout.y_total * eb);
        for (std::size_t n = 0; n < weights.size(); ++n) {
            const ExpertSlice& r = layout.slices[n];
            if (r.rows == 0) continue;
            const ExpertWeights& ew = *weights[n];
            const ClMem xs = region(xb, r.x * eb, static_cast<std::size_t>(r.rows * r.h) * eb);
            const ClMem gs = region(gb, r.mid * eb, static_cast<std::size_t>(r.rows * r.i) * eb);
            const ClMem us = region(ub, r.mid * eb, static_cast<std::size_t>(r.rows * r.i) * eb);
            const ClMem as = region(ab, r.mid * eb, static_cast<std::size_t>(r.rows * r.i) * eb);
            const ClMem ys = region(yb, r.y * eb, static_cast<std::size_t>(r.rows * r.out) * eb);
            if (r.i > 0 && r.h > 0) {
                enqueue_matmul(xs, r.rows, ew.gate, gs);
                enqueue_matmul(xs, r.rows, ew.up, us);
            } else {
                fill_zero(gs, static_cast<std::size_t>(r.rows * r.i) * eb);  // empty sums are +0
                fill_zero(us, static_cast<std::size_t>(r.rows * r.i) * eb);
            }
            add_bias(gs, ew.gate_bias, r.rows, r.i);
            add_bias(us, ew.up_bias, r.rows, r.i);
            if (ew.activation.clamped)
                enqueue_binary("kv_clamped_swiglu", gs.get(), us.get(), as.get(), r.rows * r.i,
                               static_cast<cl_float>(ew.activation.alpha), static_cast<cl_float>(ew.activation.limit));
            else
                enqueue_binary("kv_swiglu", gs.get(), us.get(), as.get(), r.rows * r.i);
            if (r.i > 0)
                enqueue_matmul(as, r.rows, ew.down, ys);
            else
                fill_zero(ys, static_cast<std::size_t>(r.rows * r.out) * eb);
            add_bias(ys, ew.down_bias, r.rows, r.out);
        }
        return yb;
    }

    // kv_causal_attention_panels runs here (for head dims a multiple of 16):
    // a CPU device, whose work-items run one after another, with f32 sums.
    bool panel_attention() const { return info_->cpu && caps_.accumulation == DType::f32; }

    // KV_ATTN_MAX_DIM of attention.cl.
    static constexpr std::int64_t kAttentionMaxDim = 512;

    static bool one_dtype(std::span<const TensorView> parts) {
        return std::all_of(parts.begin(), parts.end(), [&](const TensorView& p) { return p.dtype == parts.front().dtype; });
    }

    // kv_causal_attention_panels' keys: [n, ⌈S/16⌉, D, 16] from n views of
    // [S, D] of one dtype, in that dtype — out[g][p][j][i] = parts[g][16p + i][j],
    // zero (+0 in every format: a Tensor starts zero-filled) past S.
    static Tensor key_panels(std::span<const TensorView> parts) {
        const TensorView& first = parts.front();
        const std::int64_t s_count = first.dim(0), d = first.dim(1), np = (s_count + kPanel - 1) / kPanel;
        Tensor out(first.dtype, {static_cast<std::int64_t>(parts.size()), np, d, kPanel});
        const auto fill = [&]<typename E>(E) {
            E* dst = static_cast<E*>(out.raw());
            for (std::size_t g = 0; g < parts.size(); ++g) {
                const E* src = static_cast<const E*>(parts[g].host_data());
                E* head = dst + static_cast<std::size_t>(g) * static_cast<std::size_t>(np * d * kPanel);
                for (std::int64_t s = 0; s < s_count; ++s) {
                    E* col = head + static_cast<std::size_t>((s / kPanel) * d * kPanel + s % kPanel);
                    for (std::int64_t j = 0; j < d; ++j) col[j * kPanel] = src[s * d + j];
                }
            }
        };
        switch (dtype_size(first.dtype)) {
            case 2: fill(std::uint16_t{}); break;
            case 4: fill(std::uint32_t{}); break;
            case 8: fill(std::uint64_t{}); break;
            default: fail(ErrorCode::internal, "key_panels: element size {} of {}", dtype_size(first.dtype), dtype_name(first.dtype));
        }
        return out;
    }

    // key_panels on the device, from keys [n, S, D] stacked there (kv_key_panels).
    DeviceArg key_panels_here(const DeviceArg& keys, std::int64_t n, std::int64_t s_count, std::int64_t d) {
        const std::int64_t count = n * ((s_count + kPanel - 1) / kPanel) * d * kPanel;
        PooledMem pb = output(count);
        const cl_kernel k = kernel("attention.cl", "kv_key_panels", 0);
        set_args(k, keys, pb, static_cast<cl_int>(n), static_cast<cl_int>(s_count), static_cast<cl_int>(d));
        launch_1d(k, count);
        return DeviceArg(std::move(pb));
    }

    // [n, rows, cols] from n views of [rows, cols] of one dtype, in that dtype.
    static Tensor stacked(std::span<const TensorView> parts) {
        const TensorView& first = parts.front();
        Tensor out(first.dtype, {static_cast<std::int64_t>(parts.size()), first.dim(0), first.dim(1)});
        const std::size_t bytes = static_cast<std::size_t>(first.numel()) * dtype_size(first.dtype);
        for (std::size_t g = 0; g < parts.size(); ++g)
            std::memcpy(static_cast<std::byte*>(out.raw()) + g * bytes, parts[g].host_data(), bytes);
        return out;
    }

    // A __local kernel argument of this many bytes.
    struct LocalBytes {
        std::size_t bytes;
    };

    static void check_int_range(const char* op, std::initializer_list<std::int64_t> dims) {
        for (std::int64_t d : dims)
            KVASIR_CHECK(d < (std::int64_t{1} << 31), ErrorCode::unsupported,
                         "{}: dimension {} exceeds the 32-bit indices of the OpenCL kernels", op, d);
    }

    std::size_t storage_bytes() const { return caps_.storage == DType::f16 ? 2 : 4; }

    // CL_MEM_COPY_HOST_PTR: one allocation, one copy (the runtime's own: no
    // host wait counted, the call returns once it has taken the bytes).
    // The plain rope's inverse frequencies for (d, theta): kv_rope_freq's
    // table, computed on the first use and kept (a few per model). Under the node's lock.
    cl_mem rope_table(std::int64_t d, cl_float theta) {
        const auto key = std::make_pair(d, std::bit_cast<std::uint32_t>(theta));
        auto it = rope_tables_.find(key);
        if (it != rope_tables_.end()) return it->second.get();
        const auto half = static_cast<std::size_t>(std::max<std::int64_t>(d / 2, 1));
        ClMem table(KVCL_CREATE(clCreateBuffer, runtime_->context(), CL_MEM_READ_WRITE, half * sizeof(cl_float), nullptr));
        ++shared_->transfers.allocations;
        const cl_kernel k = kernel("elementwise.cl", "kv_rope_freq", 0);
        set_args(k, table.get(), static_cast<cl_int>(d), theta);
        launch_1d(k, static_cast<std::int64_t>(half));
        return rope_tables_.emplace(key, std::move(table)).first->second.get();
    }

    // A small host table on the device, uploaded again only when it changes.
    struct KeptUpload {
        std::vector<cl_float> values;
        ClMem buffer;
    };
    cl_mem same_upload(KeptUpload& kept, const std::vector<cl_float>& values) {
        if (kept.buffer.get() == nullptr || kept.values != values) {
            // The old buffer is released here; kernels enqueued on it keep it alive until they ran.
            kept.buffer = upload_raw(values.data(), std::max<std::size_t>(values.size(), 1) * sizeof(cl_float));
            kept.values = values;
        }
        return kept.buffer.get();
    }

    ClMem upload_raw(const void* data, std::size_t bytes) const {
        ClMem b(KVCL_CREATE(clCreateBuffer, runtime_->context(), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes,
                            const_cast<void*>(data)));
        ++shared_->transfers.allocations;
        ++shared_->transfers.uploads;
        shared_->transfers.upload_bytes += bytes;
        return b;
    }

    // v's elements as the device holds them — f32, half bits, or f32 values
    // rounded to bf16 (one rounding from the caller's dtype in every case) —
    // written to dst (numel · storage_bytes()). f32/f16/bf16 → f32 goes
    // through the CPU kernels' vector converter: no staging tensor (a
    // 151936×2048 lm_head is 1.2 GB of f32); the staged path gives the same
    // bits (one exact widening, then one RNE rounding to bf16 when asked).
    void to_device_format(const TensorView& v, void* dst) const {
        const std::int64_t n = v.numel();
        if (caps_.storage == DType::f32 && v.dtype == DType::f32) {
            std::memcpy(dst, v.host_data(), static_cast<std::size_t>(n) * 4);
        } else if (caps_.storage != DType::f16 && kernels::kernel_readable(v.dtype) && kernels::cpu_has_fma_kernels()) {
            kernels::convert_rounded(v.host_data(), kernels::weight_format_of(v.dtype), kernels::rounding_to(caps_.storage),
                                     static_cast<float*>(dst), n);
        } else {
            Tensor staged;
            if (caps_.storage == DType::f16)
                staged = Tensor::convert(v, DType::f16);
            else if (caps_.storage == DType::bf16)
                staged = Tensor::convert(Tensor::convert(v, DType::bf16), DType::f32);
            else
                staged = Tensor::convert(v, DType::f32);
            std::memcpy(dst, staged.raw(), staged.nbytes());
        }
    }

    // A device buffer of `bytes` filled on the host through a mapping.
    template <typename Fill>
    ClMem upload_mapped(std::size_t bytes, Fill&& fill) const {
        ClMem buffer(KVCL_CREATE(clCreateBuffer, runtime_->context(), CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR, bytes, nullptr));
        ++shared_->transfers.allocations;
        void* host = KVCL_CREATE(clEnqueueMapBuffer, runtime_->queue(), buffer.get(), CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION,
                                 0, bytes, 0, nullptr, nullptr);
        shared_->waited();  // a blocking map waits for the queue
        fill(static_cast<std::byte*>(host));
        KVCL_CHECK(clEnqueueUnmapMemObject(runtime_->queue(), buffer.get(), host, 0, nullptr, nullptr));
        ++shared_->transfers.uploads;
        shared_->transfers.upload_bytes += bytes;
        return buffer;
    }

    // The tensor as the device holds it, in a buffer of its own (a weight,
    // kept by the cache).
    ClMem upload_new(const TensorView& v) const {
        if (caps_.storage == DType::f32 && v.dtype == DType::f32) return upload_raw(v.host_data(), static_cast<std::size_t>(v.numel()) * 4);
        return upload_mapped(static_cast<std::size_t>(v.numel()) * storage_bytes(),
                             [&](std::byte* host) { to_device_format(v, host); });
    }
    // An activation as the device holds it: where it is already, when it is
    // (part of) one of this node's results (on_device); else in a buffer from
    // the pool — a blocking write of f32 as it is, or converted through a mapping.
    DeviceArg upload(const TensorView& v) const {
        if (std::optional<DeviceArg> here = on_device(v)) return std::move(*here);
        const std::size_t bytes = static_cast<std::size_t>(v.numel()) * storage_bytes();
        if (async_uploads_ && resident_ && DeviceResidency::active() && bytes > 0) {
            // Inside a forward pass: staged in the device's format and written
            // without a wait (the queue keeps the order; NodeShared::in_flight
            // keeps the bytes).
            std::vector<std::byte> staged(bytes);
            if (caps_.storage == DType::f32 && v.dtype == DType::f32)
                std::memcpy(staged.data(), v.host_data(), bytes);
            else
                to_device_format(v, staged.data());
            PooledMem b = device_buffer(bytes);
            shared_->in_flight.push_back(std::move(staged));
            KVCL_CHECK(clEnqueueWriteBuffer(runtime_->queue(), b.get(), CL_FALSE, 0, bytes, shared_->in_flight.back().data(), 0,
                                            nullptr, nullptr));
            ++shared_->transfers.uploads;
            shared_->transfers.upload_bytes += bytes;
            return DeviceArg(std::move(b));
        }
        if (caps_.storage != DType::f32 || v.dtype != DType::f32)
            return DeviceArg(upload_pooled(bytes, [&](std::byte* host) { to_device_format(v, host); }));
        PooledMem b = device_buffer(bytes);
        if (bytes == 0) return DeviceArg(std::move(b));
        KVCL_CHECK(clEnqueueWriteBuffer(runtime_->queue(), b.get(), CL_TRUE, 0, bytes, v.host_data(), 0, nullptr, nullptr));
        ++shared_->transfers.uploads;
        shared_->waited();  // a blocking write waits for the queue
        shared_->transfers.upload_bytes += bytes;
        return DeviceArg(std::move(b));
    }

    // The result of this node that v views, if it is one: v's elements are
    // those of the result from element device_offset/4 on (its f32 view), held
    // on the device in storage format — exactly what upload(v) would make of
    // them. The whole buffer, or a sub-buffer where the offset is aligned for
    // one, else a device-to-device copy of the slice. No host wait.
    const ClResident* ours(const TensorView& v) const {
        const auto* r = dynamic_cast<const ClResident*>(v.device);
        if (r == nullptr || r->node() != shared_.get() || r->carried() || v.dtype != DType::f32 || v.device_offset % 4 != 0)
            return nullptr;
        const std::int64_t first = static_cast<std::int64_t>(v.device_offset / 4);
        return first + v.numel() <= r->numel() ? r : nullptr;
    }
    std::optional<DeviceArg> on_device(const TensorView& v) const {
        const ClResident* r = ours(v);
        if (r == nullptr) return std::nullopt;
        const std::size_t offset = v.device_offset / 4 * storage_bytes(), bytes = static_cast<std::size_t>(v.numel()) * storage_bytes();
        if (offset == 0) {
            KVCL_CHECK(clRetainMemObject(r->get()));
            return DeviceArg(ClMem(r->get()));
        }
        if (offset % std::max<std::size_t>(info_->base_align_bytes, 1) == 0) {
            const cl_buffer_region region{offset, std::max<std::size_t>(bytes, storage_bytes())};
            return DeviceArg(ClMem(KVCL_CREATE(clCreateSubBuffer, r->get(), 0, CL_BUFFER_CREATE_TYPE_REGION, &region)));
        }
        PooledMem copy = device_buffer(bytes);
        if (bytes > 0) {
            KVCL_CHECK(clEnqueueCopyBuffer(runtime_->queue(), r->get(), copy.get(), offset, 0, bytes, 0, nullptr, nullptr));
            ++shared_->transfers.launches;
        }
        return DeviceArg(std::move(copy));
    }

    // An op's result: left on the device inside a DeviceResidency scope
    // (resident=1), else read back now.
    Tensor result(PooledMem buffer, const Shape& shape) const {
        if (!resident_ || !DeviceResidency::active()) return download(buffer, shape);
        return Tensor::on_device(shape, std::make_shared<ClResident>(shared_, runtime_->queue(), std::move(buffer),
                                                                     shape_numel(shape), caps_.storage == DType::f16));
    }
    // A buffer of `bytes` from the pool, filled on the host through a mapping.
    template <typename Fill>
    PooledMem upload_pooled(std::size_t bytes, Fill&& fill) const {
        PooledMem b = device_buffer(bytes);
        if (bytes == 0) return b;
        void* host = KVCL_CREATE(clEnqueueMapBuffer, runtime_->queue(), b.get(), CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                 bytes, 0, nullptr, nullptr);
        try {
            fill(static_cast<std::byte*>(host));
        } catch (...) {
            (void)clEnqueueUnmapMemObject(runtime_->queue(), b.get(), host, 0, nullptr, nullptr);
            throw;
        }
        KVCL_CHECK(clEnqueueUnmapMemObject(runtime_->queue(), b.get(), host, 0, nullptr, nullptr));
        ++shared_->transfers.uploads;
        shared_->waited();  // the blocking map waited for the queue
        shared_->transfers.upload_bytes += bytes;
        return b;
    }

    // The format of a weight's matmul panels (matmul.cl): the narrowest that
    // holds the weight as this node stores it, exactly — half on a half node,
    // bf16 on a bf16 node and for a bf16 checkpoint on an f32 node (widening
    // is exact), likewise half for an f16 checkpoint; f32 otherwise.
    DType panel_format(DType w) const {
        if (caps_.storage == DType::f16 || caps_.storage == DType::bf16) return caps_.storage;
        return w == DType::bf16 || w == DType::f16 ? w : DType::f32;
    }

    // One weight row as panel elements: the weight's own bits where its dtype
    // is the panel format, else the row as the device stores it (f32 values,
    // or half bits), narrowed to bf16 by dropping 16 bits that are zero
    // (the values are bf16-rounded already).
    void panel_row(const TensorView& row, DType format, std::byte* dst, std::vector<float>& scratch) const {
        const std::size_t n = static_cast<std::size_t>(row.numel());
        if (row.dtype == format) {
            std::memcpy(dst, row.host_data(), n * dtype_size(format));
        } else if (format == DType::bf16) {
            scratch.resize(n);
            to_device_format(row, scratch.data());
            for (std::size_t i = 0; i < n; ++i) {
                std::uint32_t bits;
                std::memcpy(&bits, &scratch[i], 4);
                const auto top = static_cast<std::uint16_t>(bits >> 16);
                std::memcpy(dst + 2 * i, &top, 2);
            }
        } else {
            to_device_format(row, dst);  // f32 panels on an f32 node, half bits on a half node
        }
    }

    // matmul's weight [N, K] as kv_matmul_packed reads it (matmul.cl): panels
    // of 16 outputs, k-major, zero past N, in panel_format(). A panel's 16
    // rows are converted into a staging block, then interleaved into the
    // mapped buffer in write order (contiguous stores, 16 sequential read
    // streams); the host's threads share the panels (a first upload writes
    // gigabytes of fresh memory: BENCHMARKS.md, "OpenCL matmul on packed weights").
    ClMem upload_packed(const TensorView& w) const {
        const std::int64_t n_count = w.dim(0), k_count = w.dim(1), panels = (n_count + kPanel - 1) / kPanel;
        const DType format = panel_format(w.dtype);
        const std::size_t elem = dtype_size(format), row_bytes = static_cast<std::size_t>(k_count) * elem;
        return upload_mapped(static_cast<std::size_t>(panels * kPanel) * row_bytes, [&](std::byte* host) {
            const auto* src = static_cast<const std::byte*>(w.host_data());
            const std::size_t src_row = static_cast<std::size_t>(k_count) * dtype_size(w.dtype);
            std::exception_ptr failure;
#pragma omp parallel if (panels > 1)
            {
                std::vector<std::byte> block(static_cast<std::size_t>(kPanel) * row_bytes);
                std::vector<float> scratch;
                const auto interleave = [&](auto size, std::byte* dst) {  // elements of `size` bytes, moved by memcpy
                    constexpr std::size_t n = decltype(size)::value;
                    for (std::int64_t k = 0; k < k_count; ++k)
                        for (std::int64_t j = 0; j < kPanel; ++j)
                            std::memcpy(dst + static_cast<std::size_t>(k * kPanel + j) * n,
                                        block.data() + static_cast<std::size_t>(j * k_count + k) * n, n);
                };
#pragma omp for schedule(static)
                for (std::int64_t p = 0; p < panels; ++p) {
                    try {
                        for (std::int64_t j = 0; j < kPanel; ++j) {
                            std::byte* row = block.data() + static_cast<std::size_t>(j) * row_bytes;
                            const std::int64_t n = p * kPanel + j;
                            if (n < n_count)
                                panel_row(TensorView{w.dtype, src + static_cast<std::size_t>(n) * src_row, {k_count}}, format,
                                          row, scratch);
                            else
                                std::fill(row, row + row_bytes, std::byte{0});
                        }
                    } catch (...) {
#pragma omp critical(kvasir_upload_packed)
                        if (!failure) failure = std::current_exception();
                        continue;
                    }
                    std::byte* dst = host + static_cast<std::size_t>(p * kPanel) * row_bytes;
                    if (elem == 2)
                        interleave(std::integral_constant<std::size_t, 2>{}, dst);
                    else
                        interleave(std::integral_constant<std::size_t, 4>{}, dst);
                }
            }
            if (failure) std::rethrow_exception(failure);
        });
    }

    // A weight (matmul's second operand, a norm's or conv's weight, A_log,
    // dt_bias): the device copy from the node's cache (weight_cache.hpp says
    // what it takes and why that is never stale), else uploaded for this
    // call. A new reference to the buffer: an entry evicted meanwhile stays
    // valid until the op releases it.
    ClMem weight(const TensorView& w) const {
        if (ours(w) != nullptr && w.device_offset == 0) {  // one of this node's results (a norm scale 1 + w)
            KVCL_CHECK(clRetainMemObject(ours(w)->get()));
            return ClMem(ours(w)->get());
        }
        const std::shared_ptr<const ClMem> resident = weights_->get(
            w, caps_.storage, static_cast<std::uint64_t>(w.numel()) * storage_bytes(), [&] { return upload_new(w); });
        KVCL_CHECK(clRetainMemObject(resident->get()));
        return ClMem(resident->get());
    }
    // matmul's weight in panels (upload_packed), cached apart from its plain copy.
    ClMem packed_weight(const TensorView& w) const {
        const auto panels = static_cast<std::uint64_t>((w.dim(0) + kPanel - 1) / kPanel);
        const std::shared_ptr<const ClMem> resident = weights_->get(
            w, caps_.storage, panels * kPanel * static_cast<std::uint64_t>(w.dim(1)) * dtype_size(panel_format(w.dtype)),
            [&] { return upload_packed(w); }, kPackedLayout);
        KVCL_CHECK(clRetainMemObject(resident->get()));
        return ClMem(resident->get());
    }

    PooledMem output(std::int64_t numel) const { return device_buffer(static_cast<std::size_t>(numel) * storage_bytes()); }
    // `bytes` of `buffer` from byte `offset` (a multiple of the device's base
    // alignment) as a buffer of its own: no allocation, no copy.
    template <class Buffer>
    ClMem region(const Buffer& buffer, std::size_t offset, std::size_t bytes) const {
        const cl_buffer_region r{offset, std::max<std::size_t>(bytes, storage_bytes())};
        return ClMem(KVCL_CREATE(clCreateSubBuffer, buffer.get(), 0, CL_BUFFER_CREATE_TYPE_REGION, &r));  // the parent's access
    }
    template <class Buffer>
    void fill_zero(const Buffer& buffer, std::size_t bytes) const {
        if (bytes == 0) return;
        const cl_uchar zero = 0;
        KVCL_CHECK(clEnqueueFillBuffer(runtime_->queue(), buffer.get(), &zero, 1, 0, bytes, 0, nullptr, nullptr));
        ++shared_->transfers.launches;
    }
    // `bytes` of device memory: an idle buffer of its size class from the
    // node's pool, else a new one (counted).
    PooledMem device_buffer(std::size_t bytes) const {
        const std::uint64_t size = DevicePool::size_class(bytes);
        if (void* idle = shared_->pool->take(size)) return PooledMem(ClMem(static_cast<cl_mem>(idle)), size, shared_->pool.get());
        cl_int err = CL_SUCCESS;
        cl_mem fresh = clCreateBuffer(runtime_->context(), CL_MEM_READ_WRITE, size, nullptr, &err);
        if (fresh == nullptr) shared_->pool->release_idle();  // refused: the idle buffers may be what is missing
        ClMem b(fresh != nullptr ? fresh : KVCL_CREATE(clCreateBuffer, runtime_->context(), CL_MEM_READ_WRITE, size, nullptr));
        ++shared_->transfers.allocations;
        return PooledMem(std::move(b), size, shared_->pool.get());
    }

    // A blocking read of `bytes` into `dst`: waits for the queue (and so for
    // the kernels before it), counted.
    template <class Buffer>
    void read(const Buffer& buffer, std::size_t bytes, void* dst) const {
        KVCL_CHECK(clEnqueueReadBuffer(runtime_->queue(), buffer.get(), CL_TRUE, 0, bytes, dst, 0, nullptr, nullptr));
        ++shared_->transfers.downloads;
        shared_->waited();
        shared_->transfers.download_bytes += bytes;
    }

    // Blocking read on the in-order queue: waits for the kernel, and any
    // execution error surfaces here through KVCL_CHECK.
    template <class Buffer>
    Tensor download(const Buffer& buffer, const Shape& shape) const {
        Tensor y(caps_.storage == DType::f16 ? DType::f16 : DType::f32, shape);
        read(buffer, y.nbytes(), y.raw());
        // bf16 needs nothing here: the kernels' stores already rounded to it.
        if (caps_.storage == DType::f16) return Tensor::convert(y, DType::f32);
        return y;
    }

    // Kernels are per backend (clSetKernelArg on a shared kernel would race);
    // `required_wg` > 0 checks that the compiled kernel really admits the
    // fixed work-group size it was written for.
    cl_kernel kernel(const char* file, const char* name, std::size_t required_wg) {
        const std::string key = fmt::format("{}:{}", file, name);
        auto it = kernels_.find(key);
        if (it != kernels_.end()) return it->second.get();
        const cl_program program = runtime_->program(file, defines_);
        ClKernel k(KVCL_CREATE(clCreateKernel, program, name));
        if (required_wg > 0) {
            std::size_t allowed = 0;
            KVCL_CHECK(clGetKernelWorkGroupInfo(k.get(), info_->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof(allowed), &allowed,
                                                nullptr));
            KVASIR_CHECK(allowed >= required_wg, ErrorCode::backend_failure,
                         "opencl: kernel {} admits {} work-items per group on {}, it needs {}", name, allowed,
                         info_->label(), required_wg);
        }
        return kernels_.emplace(key, std::move(k)).first->second.get();
    }

    static void set_arg(cl_kernel k, cl_uint index, const ClMem& buffer) { set_mem_arg(k, index, buffer.get()); }
    static void set_arg(cl_kernel k, cl_uint index, const PooledMem& buffer) { set_mem_arg(k, index, buffer.get()); }
    static void set_arg(cl_kernel k, cl_uint index, const DeviceArg& buffer) { set_mem_arg(k, index, buffer.get()); }
    static void set_arg(cl_kernel k, cl_uint index, cl_mem handle) { set_mem_arg(k, index, handle); }
    static void set_mem_arg(cl_kernel k, cl_uint index, cl_mem handle) {
        KVCL_CHECK(clSetKernelArg(k, index, sizeof(cl_mem), &handle));
    }
    static void set_arg(cl_kernel k, cl_uint index, LocalBytes local) {
        KVCL_CHECK(clSetKernelArg(k, index, local.bytes, nullptr));
    }
    template <typename T>
        requires std::is_arithmetic_v<T>
    static void set_arg(cl_kernel k, cl_uint index, T value) {
        KVCL_CHECK(clSetKernelArg(k, index, sizeof(T), &value));
    }
    template <typename... Args>
    static void set_args(cl_kernel k, const Args&... args) {
        cl_uint index = 0;
        (set_arg(k, index++, args), ...);
    }

    // Every kernel goes through here: enqueued on the in-order queue, counted.
    void enqueue(cl_kernel k, cl_uint dims, const std::size_t* global, const std::size_t* local) const {
        KVCL_CHECK(clEnqueueNDRangeKernel(runtime_->queue(), k, dims, nullptr, global, local, 0, nullptr, nullptr));
        ++shared_->transfers.launches;
    }

    // One kv_copy_block launch (nothing for an empty block).
    void copy_block(cl_mem src, cl_mem y, const BlockCopy& b) {
        if (b.rows * b.n == 0) return;
        const cl_kernel k = kernel("elementwise.cl", "kv_copy_block", 0);
        set_args(k, src, y, static_cast<cl_int>(b.rows), static_cast<cl_int>(b.n), static_cast<cl_int>(b.src_cols),
                 static_cast<cl_int>(b.src_r0), static_cast<cl_int>(b.src_c0), static_cast<cl_int>(b.src_step),
                 static_cast<cl_int>(b.src_wrap), static_cast<cl_int>(b.y_cols), static_cast<cl_int>(b.y_r0),
                 static_cast<cl_int>(b.y_c0));
        launch_1d(k, b.rows * b.n);
    }

    void launch_1d(cl_kernel k, std::int64_t n) const {
        const std::size_t global = round_up(static_cast<std::size_t>(n), elem_wg_);
        enqueue(k, 1, &global, &elem_wg_);
    }

    void launch_rows(cl_kernel k, std::int64_t rows) const {
        const std::size_t global = static_cast<std::size_t>(rows) * row_wg_;
        enqueue(k, 1, &global, &row_wg_);
    }
    // softmax / rmsnorm (rows.cl): a group only as wide as a row of `cols`
    // needs — the same bits as row_wg_ (rows.cl says why).
    void launch_narrow_rows(cl_kernel k, std::int64_t rows, std::int64_t cols) const {
        std::size_t wg = 1;
        while (wg < static_cast<std::size_t>(cols) && wg < row_wg_) wg *= 2;
        const std::size_t global = static_cast<std::size_t>(rows) * wg;
        enqueue(k, 1, &global, &wg);
    }

    Capabilities caps_;
    const DeviceInfo* info_ = nullptr;
    DeviceRuntime* runtime_ = nullptr;
    std::size_t tile_ = 16, row_wg_ = 256, elem_wg_ = 64;
    std::map<std::pair<std::int64_t, std::uint32_t>, ClMem> rope_tables_;  // rope_table
    KeptUpload rope_positions_, rope_scaled_;  // rope: the last positions and scaled frequencies uploaded
    std::string defines_;
    // The lock every op and a read of the counters takes; the counters
    // (upload_raw/upload_mapped/device_buffer/read/enqueue, and a result's
    // fetch); the pool of activations' buffers, reused. Shared with the
    // node's device results, which may outlive it.
    std::shared_ptr<NodeShared> shared_ = std::make_shared<NodeShared>();
    bool resident_ = true;  // resident=1: results stay on the device inside a DeviceResidency scope
    bool async_uploads_ = true;  // async_uploads=1: a forward pass's uploads do not wait (0: they do, as before)
    std::map<std::string, ClKernel> kernels_;
    std::unique_ptr<WeightCache<ClMem>> weights_;  // device-resident weights
};

}  // namespace

std::vector<BackendDevice> opencl_probe(std::string& reason) {
    try {
        const Enumeration& e = devices();
        std::vector<BackendDevice> out;
        for (const DeviceInfo& d : e.devices) out.push_back(BackendDevice{d.index, d.label()});
        if (out.empty()) reason = e.reason;
        return out;
    } catch (const std::exception& err) {
        reason = err.what();
        return {};
    }
}

std::unique_ptr<Backend> make_opencl_backend(const BackendSpec& spec) { return std::make_unique<OpenclBackend>(spec); }

void opencl_build_program_for_test(int device, std::string_view source, std::string_view options) {
    const DeviceInfo& info = device_at(device, fmt::format("opencl:{}", device));
    runtime_for(info).build("a test program", std::string(source), options);
}

}  // namespace kvasir
