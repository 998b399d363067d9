mps_fuzz_target(fuzz_script ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_script.c LIBS mps_server)
