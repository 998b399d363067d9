mps_fuzz_target(fuzz_pep723 ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_pep723.c LIBS mps_pystd)
