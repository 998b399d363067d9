mps_fuzz_target(fuzz_profile ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_profile.c LIBS mps_server)
