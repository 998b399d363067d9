mps_fuzz_target(fuzz_pep508 ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_pep508.c LIBS mps_pystd)
