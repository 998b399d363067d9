mps_fuzz_target(fuzz_pep440 ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_pep440.c LIBS mps_pystd)
