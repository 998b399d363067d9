# The Streamable HTTP transport and its glue.  Include this from the top-level
# CMakeLists.txt after mps_transport and mps_server are defined:
#   include(transport/http.cmake)
# The transport parses the JSON-RPC envelope (requests vs notifications, initialize), so
# mps_transport links jansson.
target_sources(mps_transport PRIVATE ${CMAKE_CURRENT_LIST_DIR}/http.c)
target_link_libraries(mps_transport PUBLIC PkgConfig::JANSSON)
target_sources(mps_server PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../server/serve_http.c)
