mps_unit_test(test_pep508 ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_pep508.c LIBS mps_pystd)
