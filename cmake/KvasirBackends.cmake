# Accelerator backend detection. Each switch is AUTO, ON or OFF:
#   AUTO  build the backend when its toolchain/runtime is found
#   ON    same, but a missing toolchain is a configure error
#   OFF   never build it
include(CheckLanguage)

function(_kvasir_resolve var found why)
  string(TOUPPER "${${var}}" mode)
  if(mode STREQUAL "OFF")
    set(${var}_ENABLED OFF PARENT_SCOPE)
    set(${var}_WHY "disabled (-D${var}=OFF)" PARENT_SCOPE)
  elseif(found)
    set(${var}_ENABLED ON PARENT_SCOPE)
    set(${var}_WHY "${why}" PARENT_SCOPE)
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "${var}=ON but ${why}")
  else()
    set(${var}_ENABLED OFF PARENT_SCOPE)
    set(${var}_WHY "${why}" PARENT_SCOPE)
  endif()
endfunction()

# OpenCL: the ICD loader and headers.
find_package(OpenCL QUIET)
if(OpenCL_FOUND)
  _kvasir_resolve(KVASIR_OPENCL TRUE "OpenCL ${OpenCL_VERSION_STRING} ICD loader")
else()
  _kvasir_resolve(KVASIR_OPENCL FALSE "no OpenCL ICD loader/headers (apt-get install ocl-icd-opencl-dev)")
endif()

# CUDA: nvcc.
if(NOT KVASIR_FUZZ)
  check_language(CUDA)
endif()
if(CMAKE_CUDA_COMPILER)
  _kvasir_resolve(KVASIR_CUDA TRUE "nvcc ${CMAKE_CUDA_COMPILER}")
else()
  _kvasir_resolve(KVASIR_CUDA FALSE "nvcc not found")
endif()

# HIP: hipcc (compiled as a separate step; see kernels/gpu).
find_program(KVASIR_HIPCC hipcc)
if(KVASIR_HIPCC AND NOT KVASIR_FUZZ)
  _kvasir_resolve(KVASIR_HIP TRUE "hipcc ${KVASIR_HIPCC}")
else()
  _kvasir_resolve(KVASIR_HIP FALSE "hipcc not found (apt-get install hipcc libamdhip64-dev)")
endif()

# OpenCL kernels are embedded into the binary: kernels/opencl/*.cl become
# byte arrays in a generated C++ source (kvasir::opencl_embedded::kernel_source),
# so a binary never searches the disk for .cl files at run time. The generator
# is a cmake -P script run at BUILD time with the .cl files as dependencies:
# editing a kernel regenerates the source and relinks; adding or removing a
# .cl file re-runs configure (CONFIGURE_DEPENDS glob). The script text is kept
# here and written into the build tree, so the OpenCL build lives in this file.
set(_KVASIR_OPENCL_EMBED_SCRIPT [=[
# Generated from cmake/KvasirBackends.cmake. Usage: cmake -DDIR=<kernels/opencl> -DOUT=<file.cpp> -P this
file(GLOB sources "${DIR}/*.cl")
list(SORT sources)
set(arrays "")
set(cases "")
set(names "")
set(i 0)
foreach(src IN LISTS sources)
  get_filename_component(name "${src}" NAME)
  file(READ "${src}" hex HEX)
  string(LENGTH "${hex}" hex_len)
  math(EXPR len "${hex_len} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND arrays "const unsigned char k_file${i}[] = {${bytes}0x00};\n")
  string(APPEND cases "    if (name == \"${name}\") return {reinterpret_cast<const char*>(k_file${i}), ${len}};\n")
  if(names)
    string(APPEND names " ")
  endif()
  string(APPEND names "${name}")
  math(EXPR i "${i} + 1")
endforeach()
file(WRITE "${OUT}.tmp" "// Generated at build time from kernels/opencl/*.cl by cmake/KvasirBackends.cmake. Do not edit.
#include <string_view>

namespace kvasir::opencl_embedded {
namespace {
${arrays}}  // namespace

std::string_view kernel_source(std::string_view name) {
${cases}    return {};
}

std::string_view kernel_names() { return \"${names}\"; }

}  // namespace kvasir::opencl_embedded
")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
]=])

function(_kvasir_opencl_embed_kernels out_var)
  set(dir ${PROJECT_SOURCE_DIR}/kernels/opencl)
  set(script ${PROJECT_BINARY_DIR}/kvasir_opencl_embed.cmake)
  set(out ${PROJECT_BINARY_DIR}/generated/kvasir_opencl_kernels.cpp)
  file(CONFIGURE OUTPUT ${script} CONTENT "${_KVASIR_OPENCL_EMBED_SCRIPT}" @ONLY)
  file(GLOB cl_files CONFIGURE_DEPENDS ${dir}/*.cl)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DDIR=${dir} -DOUT=${out} -P ${script}
    DEPENDS ${cl_files} ${script}
    COMMENT "Embedding OpenCL kernels (kernels/opencl/*.cl)"
    VERBATIM)
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()

# Attach the enabled accelerator backends to the backend library. Each
# backend lives in lib/kvasir/backend/<name>/ and is only compiled when
# enabled; the registry learns about it through a KVASIR_HAVE_<NAME> define.
function(kvasir_backends_attach target)
  if(KVASIR_OPENCL_ENABLED)
    file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/kvasir/backend/opencl/*.cpp)
    if(srcs)
      _kvasir_opencl_embed_kernels(embedded)
      target_sources(${target} PRIVATE ${srcs} ${embedded})
      target_link_libraries(${target} PUBLIC OpenCL::OpenCL)
      target_compile_definitions(${target} PUBLIC KVASIR_HAVE_OPENCL=1 CL_TARGET_OPENCL_VERSION=120)
    endif()
  endif()
  if(EXISTS ${PROJECT_SOURCE_DIR}/cmake/KvasirGpu.cmake)
    include(${PROJECT_SOURCE_DIR}/cmake/KvasirGpu.cmake)
    kvasir_gpu_attach(${target})
  endif()
endfunction()

function(kvasir_backends_summary)
  message(STATUS "kvasir-equiv backends:")
  message(STATUS "  ✓ cpu-ref  f64 oracle (always)")
  message(STATUS "  ✓ cpu      f32 SIMD + threads (always)")
  foreach(b OPENCL CUDA HIP)
    string(TOLOWER ${b} name)
    if(KVASIR_${b}_ENABLED)
      message(STATUS "  ✓ ${name}  ${KVASIR_${b}_WHY}")
    else()
      message(STATUS "  ✗ ${name}  ${KVASIR_${b}_WHY}")
    endif()
  endforeach()
endfunction()
