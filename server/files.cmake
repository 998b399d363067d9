# The start-up runner (profiles/runner.py): the server starts every script through it so
# that open matplotlib figures are saved into outputs/.  It lands in its own directory next
# to the server binary, where server/exec/runner.c looks for it at run time (or at $MPS_RUNNER;
# installed: <prefix>/share/mcp-python-exec-sandbox/runner/runner.py).  The directory is
# mounted read-only into the sandbox at /opt/mps, so it holds nothing else (but the
# session kernel, profiles/kernel.py).
#
# The top CMakeLists.txt includes this file after the mps_server library.
configure_file(${CMAKE_CURRENT_LIST_DIR}/../profiles/runner.py
               ${CMAKE_BINARY_DIR}/mps-runner/runner.py COPYONLY)
# The session kernel (server/exec/session.c) is looked for next to the runner.
configure_file(${CMAKE_CURRENT_LIST_DIR}/../profiles/kernel.py
               ${CMAKE_BINARY_DIR}/mps-runner/kernel.py COPYONLY)

# The profiles (and the warm-up list) beside the binary too, so a build directory anywhere
# finds them (server/config/config.c looks in <bindir>/profiles first).
file(GLOB MPS_PROFILE_FILES ${CMAKE_CURRENT_LIST_DIR}/../profiles/*.toml ${CMAKE_CURRENT_LIST_DIR}/../profiles/warmup.txt)
foreach(f ${MPS_PROFILE_FILES})
  get_filename_component(name ${f} NAME)
  configure_file(${f} ${CMAKE_BINARY_DIR}/profiles/${name} COPYONLY)
endforeach()
