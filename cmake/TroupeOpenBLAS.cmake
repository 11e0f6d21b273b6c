# OpenBLAS as one imported target, OpenBLAS::OpenBLAS, after find_package(OpenBLAS CONFIG).
#
# Debian's OpenBLAS 0.3.21 ships a CMake config that sets variables only (OpenBLAS_INCLUDE_DIRS,
# OpenBLAS_LIBRARIES); configs that define the target themselves are used as they are. Included by
# the build and again by the installed troupeConfig.cmake: troupe_kernels links the target by name,
# so its exported link interface names a target that each consumer's find_package(troupe) defines
# from the OpenBLAS found there, not a path from the machine troupe was built on.
if(NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()
