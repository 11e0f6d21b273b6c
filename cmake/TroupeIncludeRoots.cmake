# Include roots that follow the links: a header resolves only for targets that link its library.
#
# Every header is included by its path from the repository root ("engine/ndarray.hpp",
# "actors/config/config.hpp"), but no target sees the repository root. Instead each library
# publishes a root of its own in the build tree, ${PROJECT_BINARY_DIR}/include/<target>, holding
# symbolic links to its own headers under their repository paths, and adds it as its PUBLIC
# include directory. So "engine/ndarray.hpp" resolves only where troupe_engine is linked (directly
# or through a PUBLIC link), and an include against the arrows of docs/architecture.md fails to
# compile with "No such file or directory" (tests/CMakeLists.txt checks that it does).
#
# The links point into the source tree, so an edited header needs no reconfigure. The set of
# headers is globbed with CONFIGURE_DEPENDS: adding or removing a header reconfigures at the next
# build. Compiler messages and debuggers name a header by its path under the include root, which
# is a link to the file in the source tree.
#
# Installed (cmake/TroupeInstall.cmake), every library's headers sit under one root,
# <prefix>/include/troupe, under the same paths, and each exported library names that root.

include(GNUInstallDirs)

# troupe_include_root(<target> <folder> [HEADERS <file>...] [EXCLUDE <entry>...] [WHOLE_FOLDER])
#
# Publishes the headers of <folder> (a path relative to the repository root) that belong to
# <target>:
#   - by default every header (.h, .hpp) and every subfolder of <folder>, except subfolders with a
#     CMakeLists.txt (libraries of their own, which publish themselves) and the EXCLUDEd entries
#     (headers of another library in the same folder);
#   - HEADERS: only these files of <folder>;
#   - WHOLE_FOLDER: one link for the whole folder (test helpers, whose subfolders are suites).
function(troupe_include_root target folder)
  cmake_parse_arguments(arg "WHOLE_FOLDER" "" "HEADERS;EXCLUDE" ${ARGN})
  set(root "${PROJECT_BINARY_DIR}/include/${target}")
  set(source_dir "${PROJECT_SOURCE_DIR}/${folder}")
  set(published_dir "${root}/${folder}")

  if(arg_WHOLE_FOLDER)
    get_filename_component(parent "${published_dir}" DIRECTORY)
    file(MAKE_DIRECTORY "${parent}")
    file(CREATE_LINK "${source_dir}" "${published_dir}" SYMBOLIC)
  else()
    if(arg_HEADERS)
      set(entries ${arg_HEADERS})
    else()
      file(GLOB entries CONFIGURE_DEPENDS LIST_DIRECTORIES true RELATIVE "${source_dir}"
           "${source_dir}/*")
    endif()
    set(wanted "")
    foreach(entry IN LISTS entries)
      set(path "${source_dir}/${entry}")
      if(entry IN_LIST arg_EXCLUDE)
        continue()
      elseif(IS_DIRECTORY "${path}")
        if(EXISTS "${path}/CMakeLists.txt")
          continue()
        endif()
      elseif(NOT entry MATCHES "\\.(h|hpp)$")
        continue()
      elseif(NOT EXISTS "${path}")
        message(FATAL_ERROR "troupe_include_root(${target}): no header ${folder}/${entry}")
      endif()
      list(APPEND wanted "${entry}")
    endforeach()

    # Links left from an earlier configure whose header has moved away would still resolve:
    # remove them (file(REMOVE) removes a link, never what it points to).
    file(MAKE_DIRECTORY "${published_dir}")
    file(GLOB existing LIST_DIRECTORIES true RELATIVE "${published_dir}" "${published_dir}/*")
    foreach(entry IN LISTS existing)
      if(NOT entry IN_LIST wanted)
        file(REMOVE "${published_dir}/${entry}")
      endif()
    endforeach()
    foreach(entry IN LISTS wanted)
      file(CREATE_LINK "${source_dir}/${entry}" "${published_dir}/${entry}" SYMBOLIC)
    endforeach()
  endif()

  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  else()
    set(scope PUBLIC)
  endif()
  target_include_directories(${target} ${scope} "$<BUILD_INTERFACE:${root}>"
                             "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/troupe>")
endfunction()
