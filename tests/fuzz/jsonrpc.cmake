mps_fuzz_target(fuzz_jsonrpc ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_jsonrpc.c LIBS mps_server)
