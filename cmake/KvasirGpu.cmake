# The GPU backends, cuda and hip, built from ONE source.
#
#   kernels/gpu/vendor.hpp                    the shim: cudaX → hipX, vendor facts, vendor BLAS
#   kernels/gpu/math.cuh, kernels/gpu/ops.cuh kernels and their scalar math, written once
#   lib/kvasir/backend/gpu/gpu_backend_impl.inc  host code (the Backend class), written once
#   lib/kvasir/backend/gpu/cuda_backend.cu    = #define KVASIR_GPU_VENDOR_CUDA + the .inc → nvcc
#   lib/kvasir/backend/gpu/hip_backend.hip    = #define KVASIR_GPU_VENDOR_HIP  + the .inc → hipcc
#
# Each vendor's object is compiled into its own namespace (kvasir::gpu_cuda,
# kvasir::gpu_hip) and added to the backend library, so one binary carries
# both; the registry sees them through KVASIR_HAVE_CUDA / KVASIR_HAVE_HIP.
# KvasirBackends.cmake decides whether each is enabled (AUTO/ON/OFF) and calls
# kvasir_gpu_attach(kvasir_backend). A compile error in either vendor's
# object fails the build, as it must in CI.
#
# Numerics flags, the same on both vendors (kernels/gpu/ops.cuh relies on them):
#   no FMA contraction (nvcc --fmad=false, clang -ffp-contract=off): the
#   kernels' explicit fmaf calls are the only fused operations; IEEE division
#   and square root (nvcc -prec-div/-prec-sqrt, clang
#   -fhip-fp32-correctly-rounded-divide-sqrt — clang 15 still lowers sqrtf to
#   the 1-ulp v_sqrt_f32, which is why the kernels use kg_sqrtf, exact on
#   both); denormals kept (-ftz=false, -fno-gpu-flush-denormals-to-zero).
#
# Runtime: libcudart / libamdhip64 are linked dynamically and only queried at
# run time; without a driver or device the probe reports the backend absent
# (cudaGetDeviceCount / hipGetDeviceCount fail) and the binary runs as usual.
include_guard(GLOBAL)

set(KVASIR_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING
    "CUDA device code: sm_80 (A100), sm_90 (H100/H200) SASS, and compute_90 PTX for newer GPUs to JIT")
set(KVASIR_HIP_ARCHITECTURES "" CACHE STRING
    "HIP offload archs (default: gfx90a plus gfx942, or gfx940 when this hipcc does not know gfx942)")

# --- CUDA ------------------------------------------------------------------------
# Called from lib/kvasir/backend/gpu/CMakeLists.txt, at directory scope: the
# CUDA language cannot be enabled inside a function (kvasir_gpu_attach is one;
# CMake then loses the language's rule variables), so it is enabled in that
# folder, which the function adds with add_subdirectory.
function(kvasir_gpu_cuda_objects)
  add_library(kvasir_gpu_cuda OBJECT ${PROJECT_SOURCE_DIR}/lib/kvasir/backend/gpu/cuda_backend.cu)
  # "80-real;90-real;90-virtual" → "sm_80 sm_90 compute_90" for the capabilities.
  string(REGEX REPLACE "([0-9]+)-real" "sm_\\1" archs "${KVASIR_CUDA_ARCHITECTURES}")
  string(REGEX REPLACE "([0-9]+)-virtual" "compute_\\1" archs "${archs}")
  string(REPLACE ";" " " archs "${archs}")
  # C++20 like the rest of the project. CMake 3.25 knows no C++20 flag for
  # nvcc 13 and would fail ("CUDA20 not supported") or fall back to c++17:
  # tell it, at the directory scope that the generator reads.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20" PARENT_SCOPE)
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20" PARENT_SCOPE)
  set_target_properties(kvasir_gpu_cuda PROPERTIES
    CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
    CUDA_ARCHITECTURES "${KVASIR_CUDA_ARCHITECTURES}"
    POSITION_INDEPENDENT_CODE ON
    # COMPILE_OPTIONS replaces the project-wide g++ flags (nvcc takes host
    # flags through -Xcompiler).
    COMPILE_OPTIONS "--fmad=false;-prec-div=true;-prec-sqrt=true;-ftz=false;--Werror=cross-execution-space-call;-Xcompiler=-Wall,-Wextra,-ffp-contract=off")
  target_compile_definitions(kvasir_gpu_cuda PRIVATE
    KVASIR_GPU_OFFLOAD_ARCHS="${archs}"
    # fmt 9 turns FMT_CONSTEXPR off under __NVCC__ and then no longer compiles
    # as C++20 (constexpr functions calling the de-constexpr'd ones); with
    # constexpr on it is exactly what the other translation units see.
    FMT_USE_CONSTEXPR=1)
  # Include paths and definitions of the headers it shares with the library.
  target_link_libraries(kvasir_gpu_cuda PRIVATE kvasir_core CUDA::cudart CUDA::cublas)
endfunction()

# --- HIP ---------------------------------------------------------------------------
# CMake's HIP language needs a ROCm installation layout that Debian's
# packages do not have (check_language(HIP) finds no compiler), so the HIP
# object is a custom command running hipcc, with a depfile for rebuilds.
function(_kvasir_gpu_hip_archs out)
  if(KVASIR_HIP_ARCHITECTURES)
    set(${out} "${KVASIR_HIP_ARCHITECTURES}" PARENT_SCOPE)
    return()
  endif()
  # gfx942 (MI300X/MI300A) is known to clang ≥ 17 / ROCm ≥ 5.7; Debian 12's
  # hipcc 5.2 (clang 15) rejects it. gfx940 is the closest it knows: the
  # first CDNA3 target, same ISA family. Its code objects do NOT load on a
  # gfx942 at run time — build with a newer hipcc for MI300X.
  set(probe_src ${PROJECT_BINARY_DIR}/kvasir_gpu_hip/arch_probe.hip)
  file(WRITE ${probe_src} "__global__ void kvasir_arch_probe() {}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env HIP_PLATFORM=amd ${KVASIR_HIPCC} --offload-arch=gfx942 -x hip -c
                          ${probe_src} -o ${probe_src}.o
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    set(archs gfx90a gfx942)
  else()
    set(archs gfx90a gfx940)
    message(STATUS "hip: this hipcc does not know gfx942 (MI300X); building gfx90a and gfx940 instead")
  endif()
  set(KVASIR_HIP_ARCHITECTURES "${archs}" CACHE STRING
      "HIP offload archs (default: gfx90a plus gfx942, or gfx940 when this hipcc does not know gfx942)" FORCE)
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

function(_kvasir_gpu_hip_object out_obj)
  _kvasir_gpu_hip_archs(archs)
  set(src ${PROJECT_SOURCE_DIR}/lib/kvasir/backend/gpu/hip_backend.hip)
  set(dir ${PROJECT_BINARY_DIR}/kvasir_gpu_hip)
  set(obj ${dir}/hip_backend.o)
  file(MAKE_DIRECTORY ${dir})
  set(arch_flags "")
  foreach(a IN LISTS archs)
    list(APPEND arch_flags --offload-arch=${a})
  endforeach()
  string(REPLACE ";" " " archs_text "${archs}")
  set(defs $<TARGET_PROPERTY:kvasir_core,INTERFACE_COMPILE_DEFINITIONS>)
  set(build_type_flags "")
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
    list(APPEND build_type_flags -O3 -DNDEBUG)
  endif()
  if(CMAKE_BUILD_TYPE MATCHES "^(Debug|RelWithDebInfo)$")
    list(APPEND build_type_flags -g)
  endif()
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${CMAKE_COMMAND} -E env HIP_PLATFORM=amd
            ${KVASIR_HIPCC} -x hip -std=c++20 -fPIC ${build_type_flags} ${arch_flags}
            -ffp-contract=off -fhip-fp32-correctly-rounded-divide-sqrt -fno-gpu-flush-denormals-to-zero
            -Wall -Wextra
            -I${PROJECT_SOURCE_DIR}/lib -I${PROJECT_SOURCE_DIR}
            "$<$<BOOL:${defs}>:-D$<JOIN:${defs},;-D>>"
            "-DKVASIR_GPU_OFFLOAD_ARCHS=\"${archs_text}\""
            -MD -MF ${obj}.d -MT ${obj}
            -c ${src} -o ${obj}
    DEPENDS ${src}
    DEPFILE ${obj}.d
    COMMENT "hipcc: HIP backend for ${archs_text}"
    COMMAND_EXPAND_LISTS VERBATIM)
  set_source_files_properties(${obj} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  set(${out_obj} ${obj} PARENT_SCOPE)
endfunction()

# --- attach ----------------------------------------------------------------------------
function(kvasir_gpu_attach target)
  if(KVASIR_CUDA_ENABLED)
    find_package(CUDAToolkit REQUIRED)
    add_subdirectory(${PROJECT_SOURCE_DIR}/lib/kvasir/backend/gpu ${PROJECT_BINARY_DIR}/kvasir_gpu_cuda)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:kvasir_gpu_cuda>)
    target_link_libraries(${target} PUBLIC CUDA::cudart CUDA::cublas)
    target_compile_definitions(${target} PUBLIC KVASIR_HAVE_CUDA=1)
    message(STATUS "cuda: CUDA ${CUDAToolkit_VERSION}, device code ${KVASIR_CUDA_ARCHITECTURES}, cuBLAS")
  endif()
  if(KVASIR_HIP_ENABLED)
    find_library(KVASIR_AMDHIP64 amdhip64 HINTS /opt/rocm/lib)
    if(NOT KVASIR_AMDHIP64)
      message(FATAL_ERROR "hip: hipcc found but not libamdhip64 (apt-get install libamdhip64-dev), or set -DKVASIR_HIP=OFF")
    endif()
    _kvasir_gpu_hip_object(obj)
    target_sources(${target} PRIVATE ${obj})
    target_link_libraries(${target} PUBLIC ${KVASIR_AMDHIP64})
    target_compile_definitions(${target} PUBLIC KVASIR_HAVE_HIP=1)
    message(STATUS "hip: hipcc ${KVASIR_HIPCC}, device code ${KVASIR_HIP_ARCHITECTURES}, no hipBLAS (not in Debian 12)")
  endif()
endfunction()
