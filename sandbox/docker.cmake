# The docker and podman backends (sandbox/docker.c) and the containers' init.
#
# The top CMakeLists.txt includes this file, adds ${MPS_DOCKER_SOURCES} to mps_sandbox and
# defines MPS_HAVE_DOCKER (PUBLIC) there, next to MPS_HAVE_BWRAP.  The image the backend
# runs is described by profiles/Dockerfile (built by hand: `docker build -t
# mcp-python-exec-sandbox:py3.12 profiles/`); nothing here builds it.
set(MPS_DOCKER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/docker.c)

# The containers' pid 1 (drop.c's "Containers" mode, bind-mounted into every container):
# the same source as the bubblewrap drop helper, linked statically and never instrumented,
# because it runs against the image's libraries, not the host's (an image need not have the
# host's glibc, and never has the sanitizers' runtimes).
add_executable(mps-container-init ${CMAKE_CURRENT_LIST_DIR}/drop.c)
set_target_properties(mps-container-init PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
target_compile_options(mps-container-init PRIVATE -fno-sanitize=all)
target_link_options(mps-container-init PRIVATE -static -fno-sanitize=all)
