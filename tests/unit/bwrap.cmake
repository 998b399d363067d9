# The bwrap backend, driven for real: hostile scripts in real sandboxes (needs bwrap; skips
# with 77 when bubblewrap cannot create a sandbox on this machine).
mps_unit_test(test_bwrap ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_bwrap.c LIBS mps_sandbox
  TIMEOUT 300 LABELS integration)
add_dependencies(test_bwrap mps-sandbox-drop)
target_compile_definitions(test_bwrap PRIVATE
  MPS_SANDBOX_DROP_PATH="$<TARGET_FILE:mps-sandbox-drop>")
