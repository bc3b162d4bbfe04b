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

# Attach the enabled accelerator backends to the backend library. Each
# backend lives in lib/kvasir/backend/<name>/ and is only compiled when
# enabled; the registry learns about it through a KVASIR_HAVE_<NAME> define.
function(kvasir_backends_attach target)
  if(KVASIR_OPENCL_ENABLED)
    file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/kvasir/backend/opencl/*.cpp)
    if(srcs)
      target_sources(${target} PRIVATE ${srcs})
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
