# The Streamable HTTP transport and its TLS material.  Include this from the top-level
# CMakeLists.txt after mps_transport is defined:
#   include(transport/http.cmake)
# The transport parses the JSON-RPC envelope (requests vs notifications, initialize), so
# mps_transport links jansson.
#
# libmicrohttpd (with GnuTLS behind it) and libcrypto are opened with dlopen when an HTTP
# transport starts and when TLS material is made or checked, so that the stdio server never
# maps them: only their headers are used at build time (common/ links libdl for cm_dl_symbols).
target_sources(mps_transport PRIVATE ${CMAKE_CURRENT_LIST_DIR}/http/parse.c ${CMAKE_CURRENT_LIST_DIR}/http/envelope.c ${CMAKE_CURRENT_LIST_DIR}/http/forwarded.c
  ${CMAKE_CURRENT_LIST_DIR}/http/mhd.c ${CMAKE_CURRENT_LIST_DIR}/http/daemon.c ${CMAKE_CURRENT_LIST_DIR}/http/stream.c
  ${CMAKE_CURRENT_LIST_DIR}/http/session.c ${CMAKE_CURRENT_LIST_DIR}/http/mirror.c ${CMAKE_CURRENT_LIST_DIR}/http/respond.c ${CMAKE_CURRENT_LIST_DIR}/http/routes.c
  ${CMAKE_CURRENT_LIST_DIR}/http/http.c ${CMAKE_CURRENT_LIST_DIR}/tls.c)
target_include_directories(mps_transport PRIVATE ${MHD_INCLUDE_DIRS})
target_compile_options(mps_transport PRIVATE ${MHD_CFLAGS_OTHER})
target_include_directories(mps_transport PRIVATE ${OPENSSL_INCLUDE_DIR})
target_link_libraries(mps_transport PUBLIC PkgConfig::JANSSON)

# The playground page (transport/http/ui.c): ui/src/ built into the binary.
set(MPS_UI_SOURCES ${CMAKE_SOURCE_DIR}/ui/src/index.html ${CMAKE_SOURCE_DIR}/ui/src/app.js
  ${CMAKE_SOURCE_DIR}/ui/src/app.css)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/ui-assets.c
  COMMAND ${CMAKE_COMMAND} -DOUTPUT=${CMAKE_BINARY_DIR}/ui-assets.c "-DFILES=${MPS_UI_SOURCES}"
    "-DSYMBOLS=tr_ui_index_html;tr_ui_app_js;tr_ui_app_css" -P ${CMAKE_SOURCE_DIR}/ui/embed.cmake
  DEPENDS ${MPS_UI_SOURCES} ${CMAKE_SOURCE_DIR}/ui/embed.cmake
  COMMENT "Embedding the playground page (ui/src/)" VERBATIM)
target_sources(mps_transport PRIVATE ${CMAKE_CURRENT_LIST_DIR}/http/ui.c ${CMAKE_BINARY_DIR}/ui-assets.c)
