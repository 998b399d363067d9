mps_fuzz_target(fuzz_toml ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_toml.c LIBS mps_pystd)
