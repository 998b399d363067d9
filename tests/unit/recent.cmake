mps_unit_test(test_recent ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_recent.c LIBS mps_core)
