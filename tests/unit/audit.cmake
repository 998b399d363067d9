mps_unit_test(test_audit ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_audit.c LIBS mps_audit)
