mps_unit_test(test_egress ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_egress.c LIBS mps_egress)
