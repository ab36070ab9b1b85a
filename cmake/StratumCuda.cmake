# STRATUM_WITH_CUDA: AUTO (default) builds the GPU path when the CUDA Toolkit, NCCL and cuDNN 9
# are found, ON requires them, OFF never looks. The CPU path is always built.
set(STRATUM_WITH_CUDA AUTO CACHE STRING "Build the CUDA/NCCL path: AUTO, ON or OFF")
set_property(CACHE STRATUM_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

set(STRATUM_CUDA_ENABLED OFF)
if(NOT STRATUM_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_library(STRATUM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    find_path(STRATUM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    # cuDNN 9 (convolutions); the library is libcudnn.so.9, whose SONAME the binaries record.
    find_library(STRATUM_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    find_path(STRATUM_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  if(CUDAToolkit_FOUND AND STRATUM_NCCL_LIBRARY AND STRATUM_NCCL_INCLUDE_DIR
     AND STRATUM_CUDNN_LIBRARY AND STRATUM_CUDNN_INCLUDE_DIR)
    set(STRATUM_CUDA_ENABLED ON)
    message(STATUS "Stratum: CUDA ${CUDAToolkit_VERSION}, NCCL and cuDNN found: building the GPU path (sm_90)")
  elseif(STRATUM_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATUM_WITH_CUDA=ON but the CUDA Toolkit, NCCL or cuDNN 9 was not found; "
                        "set CUDAToolkit_ROOT or configure with -DSTRATUM_WITH_CUDA=AUTO")
  else()
    message(STATUS "Stratum: CUDA, NCCL or cuDNN 9 not found: building the CPU path only")
  endif()
endif()
set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for")
if(STRATUM_CUDA_ENABLED)
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # The project's warning flags are for the host compiler; nvcc passes them on.
  set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers")
  if(STRATUM_WERROR)
    set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -Xcompiler=-Werror")
  endif()
endif()
