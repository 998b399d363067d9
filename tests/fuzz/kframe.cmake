mps_fuzz_target(fuzz_kframe ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_kframe.c LIBS mps_server)
