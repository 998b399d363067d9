mps_unit_test(test_common ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_common.c LIBS mps_common)
