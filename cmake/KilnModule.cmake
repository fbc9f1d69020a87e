# kiln_module(<name> SOURCES ... [LIBS ...])
#   One OBJECT library per concern (kiln_<name>). Files ending in _avx2.c / _avx512.c / _avx512vnni.c are compiled
#   with those ISAs and must only be entered after a run-time CPU check. Plain _avx512.c files get no VNNI flag, so
#   the compiler cannot put VNNI instructions (e.g. a fused vpdpwssd) into code meant for AVX-512 CPUs without it.
#   LIBS are system libraries the module needs; they travel with the module into tests, the kiln binary and libkiln.
#
# kiln_test(<name> SOURCES ... MODULES ... [LIBS ...])
#   A cmocka test executable linked with the listed modules (list every module needed, dependencies included),
#   registered with CTest.
#
# kiln_pytest(<name> <file> [ENV ...])
#   A pytest file registered with CTest; KILN_BIN points at the built kiln binary, KILN_BUILD_DIR at the build tree.

set(KILN_WARNINGS -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter)
set(KILN_AVX2_FLAGS -mavx2 -mfma -mf16c)
set(KILN_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c)
set(KILN_AVX512VNNI_FLAGS ${KILN_AVX512_FLAGS} -mavx512vnni)

# kiln_isa_flags(<file>...): the ISA flags each file's suffix asks for (source properties are per directory, so
# every directory that compiles a file repeats this).
function(kiln_isa_flags)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "_avx2\\.c$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${KILN_AVX2_FLAGS}")
    elseif(src MATCHES "_avx512vnni\\.c$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${KILN_AVX512VNNI_FLAGS}")
    elseif(src MATCHES "_avx512\\.c$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${KILN_AVX512_FLAGS}")
    endif()
  endforeach()
endfunction()

function(kiln_c_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:${KILN_WARNINGS}>)
  if(KILN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:-Werror>)
  endif()
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include)
endfunction()

function(kiln_module name)
  cmake_parse_arguments(M "" "" "SOURCES;LIBS" ${ARGN})
  add_library(kiln_${name} OBJECT ${M_SOURCES})
  kiln_c_flags(kiln_${name})
  kiln_isa_flags(${M_SOURCES})
  set_property(GLOBAL APPEND PROPERTY KILN_MODULE_TARGETS kiln_${name})
  set_property(GLOBAL APPEND PROPERTY KILN_MODULE_LIBS ${M_LIBS} m)
  set_property(GLOBAL PROPERTY KILN_LIBS_${name} ${M_LIBS})
endfunction()

function(kiln_link_modules target)
  foreach(m IN LISTS ARGN)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:kiln_${m}>)
    get_property(libs GLOBAL PROPERTY KILN_LIBS_${m})
    target_link_libraries(${target} PRIVATE ${libs})
  endforeach()
  target_link_libraries(${target} PRIVATE m Threads::Threads)
endfunction()

function(kiln_test name)
  cmake_parse_arguments(T "" "" "SOURCES;MODULES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  kiln_c_flags(${name})
  kiln_link_modules(${name} ${T_MODULES})
  target_link_libraries(${name} PRIVATE ${CMOCKA_LIBRARIES} ${T_LIBS})
  target_include_directories(${name} PRIVATE ${CMOCKA_INCLUDE_DIRS} ${CMAKE_SOURCE_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS unit)
  set_tests_properties(${name} PROPERTIES ENVIRONMENT
    "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_SHARED_DIR=${CMAKE_SOURCE_DIR}/../shared")
endfunction()

function(kiln_pytest name file)
  cmake_parse_arguments(P "" "" "ENV" ${ARGN})
  add_test(NAME ${name} COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${file})
  # pytest exits 5 when it collected nothing (a whole file skipped, e.g. an optional package missing): a skip
  set_tests_properties(${name} PROPERTIES LABELS py SKIP_RETURN_CODE 5)
  set_tests_properties(${name} PROPERTIES ENVIRONMENT
    "KILN_BIN=$<TARGET_FILE:kiln>;KILN_BUILD_DIR=${CMAKE_BINARY_DIR};KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_SHARED_DIR=${CMAKE_SOURCE_DIR}/../shared;${P_ENV}")
endfunction()
