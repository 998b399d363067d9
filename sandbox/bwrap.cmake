# The bubblewrap backend (sandbox/bwrap.c) and its drop helper.  Its seccomp filter
# (sandbox/seccomp.c) is built with every backend: the container backends render it too.
#
# The top CMakeLists.txt includes this file, adds ${MPS_BWRAP_SOURCES} to mps_sandbox and
# defines MPS_HAVE_BWRAP (PUBLIC) there.  The helper is its own tiny executable: bwrap runs
# it inside the sandbox as the last step before the interpreter, so it links nothing but
# libc.  It lands next to the server binary, where the backend looks for it at run time
# (or at $MPS_SANDBOX_DROP; installed: <prefix>/libexec/mcp-python-exec-sandbox/).
set(MPS_BWRAP_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bwrap.c)

add_executable(mps-sandbox-drop ${CMAKE_CURRENT_LIST_DIR}/drop.c)
set_target_properties(mps-sandbox-drop PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
