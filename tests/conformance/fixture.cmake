# The conformance suite's fixture server (tests/conformance/fixture.c): the product's
# router and HTTP transport plus the suite's fixture tools, resources and prompts.  A test
# target only, never installed; tests/conformance/run.sh runs the suite against it.
# Included from tests/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/conformance/fixture.cmake)
add_executable(mps-conformance-fixture ${CMAKE_CURRENT_LIST_DIR}/fixture.c)
target_link_libraries(mps-conformance-fixture PRIVATE mps_server)
# Beside the server binary, where run.sh looks for it (and where a sandbox backend finds
# its helpers).
set_target_properties(mps-conformance-fixture PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                                                         ${CMAKE_BINARY_DIR})
if(TARGET mps-sandbox-drop)
  add_dependencies(mps-conformance-fixture mps-sandbox-drop)
endif()
