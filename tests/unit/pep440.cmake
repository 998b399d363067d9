mps_unit_test(test_pep440 ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_pep440.c LIBS mps_pystd)
