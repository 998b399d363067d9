# sandbox/seccomp.c: the syscall policy's two renderings (the native BPF program, the OCI
# profile for docker and podman) agree, run through a BPF interpreter over the same calls.
mps_unit_test(test_seccomp ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_seccomp.c
  LIBS mps_sandbox PkgConfig::JANSSON LABELS unit sandbox)
# (its docs test reads docs/security.md)
target_compile_definitions(test_seccomp PRIVATE MPS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
