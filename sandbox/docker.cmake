# The docker backend (sandbox/docker.c): no helper binary, only the client it runs.
#
# The top CMakeLists.txt includes this file, adds ${MPS_DOCKER_SOURCES} to mps_sandbox and
# defines MPS_HAVE_DOCKER (PUBLIC) there, next to MPS_HAVE_BWRAP.  The image the backend
# runs is described by profiles/Dockerfile (built by hand: `docker build -t
# mcp-python-exec-sandbox:py3.12 profiles/`); nothing here builds it.
set(MPS_DOCKER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/docker.c)
