# Locates the CUTLASS/CuTe headers shipped by the PyPI package nvidia-cutlass==4.2.0.0
# (cutlass_library/source/include) and exposes them as the interface target kdakit::cutlass.
# KDAKIT_CUTLASS_INCLUDE_DIR overrides the search.
if(NOT KDAKIT_CUTLASS_INCLUDE_DIR)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _kdakit_cutlass_dir
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _kdakit_cutlass_rc
    ERROR_QUIET)
  if(_kdakit_cutlass_rc EQUAL 0 AND EXISTS "${_kdakit_cutlass_dir}/cute/tensor.hpp")
    set(KDAKIT_CUTLASS_INCLUDE_DIR "${_kdakit_cutlass_dir}" CACHE PATH "CUTLASS/CuTe include dir")
  else()
    message(FATAL_ERROR
      "kdakit: CUTLASS headers not found. Install them with `pip install nvidia-cutlass==4.2.0.0` "
      "into the Python that CMake finds (${Python3_EXECUTABLE}), or set KDAKIT_CUTLASS_INCLUDE_DIR.")
  endif()
endif()
message(STATUS "kdakit: CUTLASS headers in ${KDAKIT_CUTLASS_INCLUDE_DIR}")
add_library(kdakit_cutlass INTERFACE)
add_library(kdakit::cutlass ALIAS kdakit_cutlass)
target_include_directories(kdakit_cutlass SYSTEM INTERFACE "${KDAKIT_CUTLASS_INCLUDE_DIR}")
