mps_fuzz_target(fuzz_cgroup ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_cgroup.c LIBS mps_sandbox)
