# The docker backend against a stand-in docker client (tests/fixtures/docker-standin): no
# Docker engine runs on our machines.  Only built when the backend is (MPS_HAVE_DOCKER).
if(MPS_DOCKER_SOURCES)
  mps_unit_test(test_docker ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_docker.c
    LIBS mps_sandbox PkgConfig::JANSSON TIMEOUT 180 LABELS unit docker)
  add_dependencies(test_docker mps-container-init)
endif()
