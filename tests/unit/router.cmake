mps_unit_test(test_router ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_router.c LIBS mps_server)
