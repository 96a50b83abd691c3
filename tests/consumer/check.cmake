# MODE install: installs the libraries of this build of dimsum (BUILD_DIR, built before ctest
# runs) into ${PREFIX}, the fixture of the find_package modes. (add_subdirectory builds them
# again, in a project where dimsum's tests, examples and tools are off.)
# Else builds and runs tests/consumer against dimsum, by add_subdirectory or by find_package
# of that install; find_package_sse2 is find_package by a consumer that sets DIMSUM_ARCH
# empty, which must be warned at configure time and get SSE2 kernels (but for
# dimsum::kernels, built as installed).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
    endif()
    set(output "${out}${err}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
    run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
    return()
endif()

set(consumer_args -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/consumer -DCMAKE_BUILD_TYPE=Release)
if(MODE STREQUAL "add_subdirectory")
    list(APPEND consumer_args -DMODE=add_subdirectory -DDIMSUM_SOURCE_DIR=${SOURCE_DIR} -DEXPECTED_ISA=wide)
else()
    list(APPEND consumer_args -DMODE=find_package -DCMAKE_PREFIX_PATH=${PREFIX})
    if(MODE STREQUAL "find_package_sse2")
        list(APPEND consumer_args -DDIMSUM_ARCH= -DEXPECTED_ISA=sse2)
    else()
        list(APPEND consumer_args -DEXPECTED_ISA=wide)
    endif()
endif()
run(${CMAKE_COMMAND} ${consumer_args})
string(FIND "${output}" "formulas compile their kernels for SSE2" warned)
if(MODE STREQUAL "find_package_sse2" AND warned EQUAL -1)
    message(FATAL_ERROR "no warning at configure time about SSE2 kernels:\n${output}")
elseif(NOT MODE STREQUAL "find_package_sse2" AND NOT warned EQUAL -1)
    message(FATAL_ERROR "a warning about SSE2 kernels where DIMSUM_ARCH is set:\n${output}")
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
foreach(program consumer consumer_kernels)
    run(${WORK_DIR}/consumer/${program})
    message(STATUS "${MODE}: ${program}: ${output}")
endforeach()
