# pystd/toml.c: hand-written cases plus the toml-test corpus, read in place from
# ../shared/toml-test (the test skips with 77 if it is absent).
mps_unit_test(test_toml ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_toml.c LIBS mps_pystd PkgConfig::JANSSON)
