# stratum_add_test(NAME SOURCES... [LIBS ...] [LABELS ...] [TIMEOUT s] [FIXTURES ...])
# Builds a GoogleTest binary and registers each of its tests with CTest. Each binary runs
# in a private temporary folder (tests/testing/private_temp_dir.cc).
include(GoogleTest)
function(stratum_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS;FIXTURES" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 60)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} stratum_private_temp_dir GTest::gtest GTest::gmock GTest::gtest_main)
  # The test helpers of tests/include/stratum/testing/ (header-only ones need no library).
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/include)
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 30
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}" FIXTURES_REQUIRED "${ARG_FIXTURES}")
endfunction()
