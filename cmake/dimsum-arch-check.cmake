# A warning at configure time when formulas would compile their kernels for SSE2: no
# DIMSUM_ARCH and no -march in the compiler flags, on x86-64. Included by dimsum's own
# CMakeLists.txt and by the installed dimsum-config.cmake.
if(NOT DIMSUM_ARCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64" AND NOT CMAKE_CXX_FLAGS MATCHES "-march=|-mavx")
    message(WARNING "dimsum: DIMSUM_ARCH is empty and CMAKE_CXX_FLAGS names no -march, so formulas compile "
                    "their kernels for SSE2, several times slower than for this machine's instruction set. "
                    "Set DIMSUM_ARCH (native, x86-64-v3, ...) before find_package(dimsum), or add -march to "
                    "CMAKE_CXX_FLAGS.")
endif()
