# The HTTP transport's parsers (needs transport/http.cmake included by the top level).
get_target_property(MPS_TRANSPORT_SOURCES mps_transport SOURCES)
if(MPS_TRANSPORT_SOURCES MATCHES "http\\.c")
  mps_fuzz_target(fuzz_http_headers ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_http_headers.c LIBS mps_transport)
  mps_fuzz_target(fuzz_http_body ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_http_body.c LIBS mps_transport)
  mps_fuzz_target(fuzz_http_forwarded ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_http_forwarded.c LIBS mps_transport)
endif()
