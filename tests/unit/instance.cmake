# sandbox/instance.c: a server instance's random id, uid block and ownership records (other
# instances are child processes on the same state directory).
mps_unit_test(test_instance ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_instance.c
  LIBS mps_sandbox LABELS unit sandbox)
