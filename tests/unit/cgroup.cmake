# sandbox/cgroup.c: the parsers of /proc/self/cgroup and /proc/self/mountinfo (the runs'
# cgroups themselves are proven by tests/integration/test_cgroups.py).
mps_unit_test(test_cgroup ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cgroup.c LIBS mps_sandbox)
