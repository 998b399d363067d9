# transport/stdio.c: the framing of newline-delimited messages.
mps_unit_test(test_stdio ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_stdio.c LIBS mps_transport)
