# sandbox/mountplan.c: a run's mount plan, rendered as bubblewrap's arguments and as docker's
# and podman's flags; the two renderings agree (table-driven).
mps_unit_test(test_mountplan ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_mountplan.c
  LIBS mps_sandbox LABELS unit sandbox)
