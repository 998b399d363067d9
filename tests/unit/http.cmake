# The HTTP transport's pure parts (needs transport/http.cmake included by the top level).
get_target_property(MPS_TRANSPORT_SOURCES mps_transport SOURCES)
if(MPS_TRANSPORT_SOURCES MATCHES "http\\.c")
  mps_unit_test(test_http ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_http.c LIBS mps_transport)
  mps_unit_test(test_forwarded ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_forwarded.c LIBS mps_transport)
endif()
