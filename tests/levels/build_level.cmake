# ctest's setup step for one level's tests (tests/levels/CMakeLists.txt):
# configures a build of the whole project for -march=MARCH in BINARY and
# builds the test programs TARGETS (comma-separated) there.
# cmake -DSOURCE=... -DBINARY=... -DMARCH=... -DTARGETS=a,b -DWERROR=ON|OFF
#       -DBUILD_TYPE=... -DCC=... -P build_level.cmake
foreach(var SOURCE BINARY MARCH TARGETS CC)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "build_level.cmake: -D${var}=... is missing")
  endif()
endforeach()
string(REPLACE "," ";" targets "${TARGETS}")
cmake_host_system_information(RESULT jobs QUERY NUMBER_OF_LOGICAL_CORES)

execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -DCX_MARCH=${MARCH} -DCX_WERROR=${WERROR}
                        -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_C_COMPILER=${CC} -DCX_BUILD_TESTS=ON
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the ${MARCH} build in ${BINARY} failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY} -j${jobs} --target ${targets} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the ${MARCH} tests in ${BINARY} failed (${rc})")
endif()
