# cmake --install build --prefix P: the binaries, the libraries with the public headers
# (every component's include/stratum, the generated version.h and the wire formats'
# proto/*.pb.h), a CMake package (find_package(Stratum CONFIG): Stratum::common,
# Stratum::ps, Stratum::worker, Stratum::coordinator) and a pkg-config file (stratum.pc).
include(CMakePackageConfigHelpers)

install(TARGETS stratum-coordinator stratum-worker stratum-train stratum-ps stratum-launch
                stratum-data stratum-predict
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS stratum_proto stratum_common stratum_ps stratum_worker stratum_coordinator
        EXPORT StratumTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(component common ps worker coordinator)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${component}/include/stratum
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(DIRECTORY ${PROJECT_BINARY_DIR}/generated/stratum DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/proto
        FILES_MATCHING PATTERN "*.pb.h")

# Exported names: Stratum::common for stratum_common, ...
foreach(component proto common ps worker coordinator)
  set_target_properties(stratum_${component} PROPERTIES EXPORT_NAME ${component})
endforeach()
install(EXPORT StratumTargets NAMESPACE Stratum:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Stratum)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/StratumConfig.cmake.in
  ${PROJECT_BINARY_DIR}/StratumConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Stratum)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/StratumConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/StratumConfig.cmake
              ${PROJECT_BINARY_DIR}/StratumConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Stratum)

# pkg-config: the libraries in link order, then what they need.
set(STRATUM_PC_LIBS "-lstratum_coordinator -lstratum_worker -lstratum_ps -lstratum_common -lstratum_proto ${STRATUM_DNNL_LIBRARY} ${STRATUM_FARMHASH_LIBRARY} -lgomp")
set(STRATUM_PC_CFLAGS "")
if(STRATUM_CUDA_ENABLED)
  string(APPEND STRATUM_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -ldl ${STRATUM_NCCL_LIBRARY} ${STRATUM_CUDNN_LIBRARY}")
  string(APPEND STRATUM_PC_CFLAGS " -I${CUDAToolkit_INCLUDE_DIRS} -DSTRATUM_WITH_CUDA=1")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/stratum.pc.in ${PROJECT_BINARY_DIR}/stratum.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/stratum.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
