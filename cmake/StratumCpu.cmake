# STRATUM_CPU_FLAGS: instruction-set flags for the CPU math. Default: -mavx2 -mfma when the
# build machine runs them (Eigen's matrix products are several times faster with them;
# its AVX-512 path, -march=native on this machine kind, measured 4x slower than AVX2+FMA).
# Set it to "" for binaries that must run on older CPUs.
if(NOT DEFINED STRATUM_CPU_FLAGS)
  include(CheckCXXSourceRuns)
  set(CMAKE_REQUIRED_FLAGS "-mavx2 -mfma")
  check_cxx_source_runs("
    int main() { return __builtin_cpu_supports(\"avx2\") && __builtin_cpu_supports(\"fma\") ? 0 : 1; }"
    STRATUM_HOST_HAS_AVX2_FMA)
  unset(CMAKE_REQUIRED_FLAGS)
  if(STRATUM_HOST_HAS_AVX2_FMA)
    set(default_flags "-mavx2 -mfma")
  else()
    set(default_flags "")
  endif()
  set(STRATUM_CPU_FLAGS "${default_flags}" CACHE STRING "Instruction-set flags for CPU math")
endif()
message(STATUS "Stratum: CPU flags '${STRATUM_CPU_FLAGS}'")
separate_arguments(stratum_cpu_flags_list UNIX_COMMAND "${STRATUM_CPU_FLAGS}")
add_compile_options(${stratum_cpu_flags_list})
