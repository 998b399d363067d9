# The egress proxy's pure parsers: rules, addresses and the policy; request heads, SOCKS5, URLs.
mps_fuzz_target(fuzz_egress_rules ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_egress_rules.c LIBS mps_egress)
mps_fuzz_target(fuzz_egress_http ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_egress_http.c LIBS mps_egress)
