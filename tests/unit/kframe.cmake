# server/exec/kframe.c: the session kernel's frames and results (hostile input).
mps_unit_test(test_kframe ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_kframe.c LIBS mps_server)
