# server/router.c's extension points: extension capabilities, methods and tools, and
# server -> client requests, over in-memory sinks.
mps_unit_test(test_extension ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_extension.c LIBS mps_server)
