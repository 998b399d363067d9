mps_fuzz_target(fuzz_files ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_files.c LIBS mps_files)
