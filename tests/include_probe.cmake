# A wrong include fails to build (run by CTest, see tests/CMakeLists.txt). For one target, with the
# include directories its own sources are compiled with:
#   - a translation unit that includes ALLOWED (a header the target may use) compiles, so the
#     command line itself is sound;
#   - one that includes any of FORBIDDEN (headers of layers the target does not link) fails, and
#     fails because the header is not found, not for some other reason.
# The translation units are written to WORK_DIR, outside the source tree, so that no include
# resolves relative to them.
#
#   cmake -D COMPILER=c++ -D TARGET=troupe_kernels -D "INCLUDE_DIRS=dir1|dir2"
#         -D ALLOWED=kernels/cpu/gemm.hpp -D "FORBIDDEN=engine/ndarray.hpp|schema/codec.hpp"
#         -D WORK_DIR=... -P include_probe.cmake
foreach(var COMPILER TARGET INCLUDE_DIRS ALLOWED FORBIDDEN WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "include_probe: -D ${var}=... is missing")
  endif()
endforeach()

string(REPLACE "|" ";" include_dirs "${INCLUDE_DIRS}")
string(REPLACE "|" ";" forbidden "${FORBIDDEN}")
set(flags -std=c++20 -fsyntax-only)
foreach(dir IN LISTS include_dirs)
  list(APPEND flags "-I${dir}")
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}")

# Compiles a translation unit that includes `header`; sets <prefix>_rc and <prefix>_output.
function(compile_including header prefix)
  string(MAKE_C_IDENTIFIER "${header}" name)
  set(unit "${WORK_DIR}/${name}.cpp")
  file(WRITE "${unit}" "#include \"${header}\"\n")
  execute_process(COMMAND "${COMPILER}" ${flags} "${unit}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE output ERROR_VARIABLE output)
  set(${prefix}_rc "${rc}" PARENT_SCOPE)
  set(${prefix}_output "${output}" PARENT_SCOPE)
endfunction()

compile_including("${ALLOWED}" allowed)
if(NOT allowed_rc EQUAL 0)
  message(FATAL_ERROR "${TARGET}: its own header ${ALLOWED} does not compile with its include "
                      "directories, so this probe proves nothing:\n${allowed_output}")
endif()
message(STATUS "${TARGET}: \"${ALLOWED}\" compiles")

set(failures "")
foreach(header IN LISTS forbidden)
  compile_including("${header}" probe)
  string(FIND "${probe_output}" "${header}: No such file or directory" gcc_not_found)
  string(FIND "${probe_output}" "'${header}' file not found" clang_not_found)
  if(probe_rc EQUAL 0)
    string(APPEND failures "\n  \"${header}\" compiles: the include roots let ${TARGET} see it")
  elseif(gcc_not_found EQUAL -1 AND clang_not_found EQUAL -1)
    string(APPEND failures "\n  \"${header}\" fails, but not as a missing header:\n"
                           "${probe_output}")
  else()
    message(STATUS "${TARGET}: \"${header}\" is not found, as the links say")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "${TARGET}: includes against the layering:${failures}")
endif()
