# dynapipe_add_module(NAME m SRCS ... [DEPS modules...] [PRIVATE_DEPS targets...])
#   Static library dynapipe_<m> (alias dynapipe::<m>). DEPS are module names and must
#   be listed in DYNAPIPE_LAYER_<m> (cmake/DynapipeLayers.cmake).
function(dynapipe_add_module)
  cmake_parse_arguments(M "" "NAME" "SRCS;DEPS;PRIVATE_DEPS;PUBLIC_DEPS" ${ARGN})
  foreach(dep IN LISTS M_DEPS)
    if(NOT dep IN_LIST DYNAPIPE_LAYER_${M_NAME})
      message(FATAL_ERROR "module '${M_NAME}' may not depend on '${dep}' "
                          "(allowed: ${DYNAPIPE_LAYER_${M_NAME}}; see cmake/DynapipeLayers.cmake)")
    endif()
  endforeach()
  add_library(dynapipe_${M_NAME} STATIC ${M_SRCS})
  add_library(dynapipe::${M_NAME} ALIAS dynapipe_${M_NAME})
  target_include_directories(dynapipe_${M_NAME}
    PUBLIC ${PROJECT_SOURCE_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  foreach(dep IN LISTS M_DEPS)
    target_link_libraries(dynapipe_${M_NAME} PUBLIC dynapipe_${dep})
  endforeach()
  target_link_libraries(dynapipe_${M_NAME} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
endfunction()

# dynapipe_add_test(MODULE m SOURCES ... [DEPS targets...] [LABELS ...])
#   One GoogleTest binary per module: dynapipe_<m>_tests, discovered into ctest.
function(dynapipe_add_test)
  cmake_parse_arguments(T "" "MODULE;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  set(target dynapipe_${T_MODULE}_tests)
  add_executable(${target} ${T_SOURCES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${target} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${target} PRIVATE
    DYNAPIPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" DYNAPIPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  gtest_discover_tests(${target}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
