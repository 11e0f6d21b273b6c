# What `cmake --install <build> --prefix P` puts in place (docs/embedding.md):
#
#   P/include/troupe/...            every library's public headers under the paths the sources
#                                   include them by ("actors/kvstore/kvstore.hpp"), and the
#                                   generated schema/troupe.capnp.h with troupe.capnp itself
#   P/lib/libtroupe_*.a             the static libraries
#   P/bin/troupe-node, troupe-launch
#   P/lib/cmake/troupe/             troupeConfig.cmake (+ version and targets files):
#                                   find_package(troupe) gives troupe::troupe
#   P/lib/pkgconfig/troupe.pc       pkg-config --cflags --libs troupe
#
# Why include/troupe/ and not include/: the headers keep the paths of the source tree, whose first
# parts (engine/, actors/, schema/, kernels/) are names any other project may use; under their own
# folder they cannot collide in a shared prefix such as /usr/local, and a program includes them
# exactly as troupe's own sources do, with -I P/include/troupe (which both the CMake package and
# troupe.pc add). Tests, benchmarks, fuzz targets and the other apps are not installed.

include(CMakePackageConfigHelpers)

# Every library, in link order (each before those it uses): troupe::troupe links them all.
set(troupe_installed_libraries
  troupe_gluon troupe_kvstore troupe_actors troupe_logic troupe_config troupe_schema troupe_engine
  troupe_job_trace troupe_kernels troupe_json_line troupe_log troupe_errors)

add_library(troupe INTERFACE)
add_library(troupe::troupe ALIAS troupe)
target_link_libraries(troupe INTERFACE ${troupe_installed_libraries})
foreach(library IN LISTS troupe_installed_libraries)
  # Exported as troupe::engine, troupe::kvstore, ... next to troupe::troupe.
  string(REGEX REPLACE "^troupe_" "" export_name "${library}")
  set_target_properties(${library} PROPERTIES EXPORT_NAME ${export_name})
  # The headers are C++20: a consumer compiles them as such whatever its own default.
  target_compile_features(${library} PUBLIC cxx_std_20)
endforeach()
# Linked privately by every library, it reaches the export only as $<LINK_ONLY:...>: the
# sanitizers' link options of a TROUPE_SANITIZE build, never the warning flags.
set_target_properties(troupe_options PROPERTIES EXPORT_NAME options)

install(TARGETS troupe ${troupe_installed_libraries} troupe_options
        EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS troupe-node troupe-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The headers the libraries publish (cmake/TroupeIncludeRoots.cmake): every .hpp and .h of these
# folders, each library's own.
set(troupe_header_destination "${CMAKE_INSTALL_INCLUDEDIR}/troupe")
file(GLOB_RECURSE troupe_headers CONFIGURE_DEPENDS RELATIVE "${PROJECT_SOURCE_DIR}"
     "${PROJECT_SOURCE_DIR}/kernels/*.hpp" "${PROJECT_SOURCE_DIR}/kernels/*.h"
     "${PROJECT_SOURCE_DIR}/engine/*.hpp" "${PROJECT_SOURCE_DIR}/engine/*.h"
     "${PROJECT_SOURCE_DIR}/schema/*.hpp" "${PROJECT_SOURCE_DIR}/schema/*.h"
     "${PROJECT_SOURCE_DIR}/actors/*.hpp" "${PROJECT_SOURCE_DIR}/actors/*.h")
foreach(header IN LISTS troupe_headers)
  get_filename_component(folder "${header}" DIRECTORY)
  install(FILES "${PROJECT_SOURCE_DIR}/${header}" DESTINATION "${troupe_header_destination}/${folder}")
endforeach()
install(FILES "${PROJECT_SOURCE_DIR}/schema/troupe.capnp"
              "${PROJECT_BINARY_DIR}/include/troupe_schema_capnp/schema/troupe.capnp.h"
        DESTINATION "${troupe_header_destination}/schema")

# The CMake package. Its config finds the dependencies the exported targets name (cmake/
# troupeConfig.cmake.in); FindCAF.cmake and TroupeOpenBLAS.cmake go with it.
set(troupe_cmake_destination "${CMAKE_INSTALL_LIBDIR}/cmake/troupe")
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION "${troupe_cmake_destination}")
configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in" "${PROJECT_BINARY_DIR}/troupeConfig.cmake"
  INSTALL_DESTINATION "${troupe_cmake_destination}")
# 0.x: a minor version may change the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/troupeConfig.cmake"
              "${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake"
              "${PROJECT_SOURCE_DIR}/cmake/TroupeOpenBLAS.cmake"
        DESTINATION "${troupe_cmake_destination}")

# troupe.pc. Its prefix is found from the file's own place (${pcfiledir}), so the package works
# wherever --prefix put it. The libraries are static: every library and every dependency's is in
# Libs (CAF, which has no .pc file, and CUDA's by path; the rest through Requires).
set(troupe_pc_libs "")
foreach(library IN LISTS troupe_installed_libraries)
  string(APPEND troupe_pc_libs " -l${library}")
endforeach()
get_filename_component(caf_library_dir "${CAF_core_LIBRARY}" DIRECTORY)
string(APPEND troupe_pc_libs " -L${caf_library_dir} -lcaf_io -lcaf_core")
set(troupe_pc_cflags "")
if(TROUPE_HAVE_CUDA)
  string(APPEND troupe_pc_libs " -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart")
  string(APPEND troupe_pc_cflags " -DTROUPE_HAVE_CUDA=1")
endif()
string(APPEND troupe_pc_libs " -pthread")
if(TROUPE_SANITIZE)
  # The libraries call the sanitizers' runtimes (troupe::options carries the same to CMake).
  string(APPEND troupe_pc_libs " -fsanitize=address,undefined")
endif()
file(RELATIVE_PATH troupe_pc_prefix "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" troupe_pc_prefix "${troupe_pc_prefix}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/troupe.pc.in" "${PROJECT_BINARY_DIR}/troupe.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/troupe.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
