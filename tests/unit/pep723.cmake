# pystd/pep723.c: PEP 723 block extraction and metadata checks.
mps_unit_test(test_pep723 ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_pep723.c LIBS mps_pystd)
