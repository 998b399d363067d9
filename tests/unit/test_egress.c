/* The egress proxy's pure parts: address classes, rules, the policy decision, request and
 * response heads, SOCKS5, URLs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/cm.h"
#include "egress/egress.h"

static eg_addr_t addr(const char *s) {
  eg_addr_t a;
  if (eg_addr_parse(s, strlen(s), &a) != 0) fail_msg("address %s did not parse", s);
  return a;
}

static eg_rule_t rule(const char *s) {
  eg_rule_t r;
  cm_error_t err = CM_ERROR_INIT;
  if (eg_rule_parse(s, strlen(s), &r, &err) != 0)
    fail_msg("rule %s: %s", s, cm_error_message(&err));
  cm_error_release(&err);
  return r;
}

/* ---------------------------------------------------------------- addresses */

static void test_addr_parse(void **state) {
  (void)state;
  static const char *const good[] = {"0.0.0.0", "1.2.3.4",     "255.255.255.255",  "::",
                                     "::1",     "2001:db8::1", "::ffff:127.0.0.1", "FE80::1"};
  static const char *const bad[] = {"",         "1.2.3",    "1.2.3.4.5",  "256.1.1.1",
                                    "01.2.3.4", "1.2.3.4 ", " 1.2.3.4",   "[::1]",
                                    "::1%eth0", "1.2.3.-4", "0x7f.0.0.1", "2130706433",
                                    "127.1",    "a::b::c",  "example.com"};
  eg_addr_t a;
  for (size_t i = 0; i < CM_ARRAY_SIZE(good); i++)
    if (eg_addr_parse(good[i], strlen(good[i]), &a) != 0) fail_msg("%s is an address", good[i]);
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (eg_addr_parse(bad[i], strlen(bad[i]), &a) == 0) fail_msg("%s is not an address", bad[i]);
  /* Length is honoured, not a terminator. */
  assert_int_equal(eg_addr_parse("1.2.3.45", 7, &a), 0);
  assert_int_equal(a.bytes[3], 4);
}

static void test_addr_classes(void **state) {
  (void)state;
  static const struct {
    const char *addr, *cls;
  } cases[] = {
      {"127.0.0.1", "loopback"},
      {"127.255.0.9", "loopback"},
      {"0.0.0.0", "unspecified"},
      {"0.1.2.3", "unspecified"},
      {"10.1.2.3", "private"},
      {"172.16.0.1", "private"},
      {"172.31.255.255", "private"},
      {"172.32.0.1", NULL},
      {"192.168.1.1", "private"},
      {"100.64.0.1", "shared (CGNAT)"},
      {"100.127.255.255", "shared (CGNAT)"},
      {"100.128.0.1", NULL},
      {"100.100.100.200", "cloud metadata"},
      {"169.254.169.254", "cloud metadata"},
      {"169.254.1.1", "link-local"},
      {"224.0.0.1", "multicast"},
      {"239.255.255.250", "multicast"},
      {"240.0.0.1", "reserved"},
      {"255.255.255.255", "broadcast"},
      {"8.8.8.8", NULL},
      {"198.51.100.1", "documentation"},
      {"93.184.216.34", NULL},
      {"::", "unspecified"},
      {"::1", "loopback"},
      {"::ffff:127.0.0.1", "loopback"},
      {"::ffff:10.0.0.1", "private"},
      {"::ffff:8.8.8.8", NULL},
      {"::127.0.0.1", "loopback"},
      {"::169.254.169.254", "cloud metadata"},
      {"64:ff9b::a9fe:a9fe", "cloud metadata"},
      {"64:ff9b::808:808", NULL},
      {"fe80::1", "link-local"},
      {"febf::1", "link-local"},
      {"fec0::1", "site-local"},
      {"fc00::1", "unique local (ULA)"},
      {"fd12:3456::1", "unique local (ULA)"},
      {"fd00:ec2::254", "cloud metadata"},
      {"ff02::1", "multicast"},
      {"2001:4860:4860::8888", NULL},
      {"2001:db8::1", "documentation"},
      {"200::1", "reserved"},
      /* 6to4 and Teredo lead to the IPv4 address they carry (Teredo's client, inverted). */
      {"2002:7f00:1::1", "loopback"},
      {"2002:a00:5::", "private"},
      {"2002:a9fe:a9fe::1", "cloud metadata"},
      {"2002:c633:6401::1", "documentation"},
      {"2002:808:808::1", NULL},
      {"2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"},
      {"2001:0:4136:e378:8000:63bf:f5ff:fffe", "private"},
      {"2001:0:4136:e378:8000:63bf:39cc:9bfe", "documentation"},
      {"2001:0:4136:e378:8000:63bf:f7f7:f7f7", NULL},
      /* Everything IANA's special-purpose registries mark not globally reachable. */
      {"192.0.2.1", "documentation"},
      {"203.0.113.200", "documentation"},
      {"198.18.0.1", "benchmarking"},
      {"198.19.255.254", "benchmarking"},
      {"198.20.0.1", NULL},
      {"192.0.0.1", "IETF protocol assignments"},
      {"192.0.0.170", "IETF protocol assignments"},
      {"192.0.0.9", NULL},
      {"192.0.0.10", NULL},
      {"192.0.1.1", NULL},
      {"192.88.99.1", "6to4 relay anycast (deprecated)"},
      {"192.31.196.1", NULL},
      {"192.175.48.1", NULL},
      {"::ffff:198.18.0.1", "benchmarking"},
      {"64:ff9b::c000:201", "documentation"},
      {"3fff::1", "documentation"},
      {"3fff:fff::1", "documentation"},
      {"3fff:1000::1", NULL},
      {"2001:2::1", "benchmarking"},
      {"2001:2:1::1", "IETF protocol assignments"},
      {"2001:10::1", "ORCHID (deprecated)"},
      {"2001:1f::1", "ORCHID (deprecated)"},
      {"2001:20::1", NULL},
      {"2001:30::1", NULL},
      {"2001:3::1", NULL},
      {"2001:4:112::1", NULL},
      {"2001:1::1", NULL},
      {"2001:1::4", "IETF protocol assignments"},
      {"2001:1ff::1", "IETF protocol assignments"},
      {"2001:200::1", NULL},
      {"64:ff9b:1::1", "local-use IPv4/IPv6 translation"},
      {"100::1", "discard-only"},
      {"100:0:0:1::1", "dummy prefix"},
      {"5f00::1", "segment routing (SRv6 SIDs)"},
      {"2620:4f:8000::1", NULL},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    eg_addr_t a = addr(cases[i].addr);
    const char *got = eg_addr_class(&a);
    if ((got == NULL) != (cases[i].cls == NULL) || (got && strcmp(got, cases[i].cls) != 0))
      fail_msg("%s: class %s, expected %s", cases[i].addr, got ? got : "public",
               cases[i].cls ? cases[i].cls : "public");
  }
}

static void test_net_classes(void **state) {
  (void)state;
  static const struct {
    const char *rule, *cls;
  } cases[] = {
      {"10.0.0.0/8", "private"},
      {"10.0.0.0/7", NULL},
      {"0.0.0.0/0", NULL},
      {"127.0.0.0/16", "loopback"},
      {"169.254.0.0/16", "link-local"},
      {"169.254.169.254", "cloud metadata"},
      {"fd00::/8", "unique local (ULA)"},
      {"::/0", NULL},
      {"2000::/3", NULL},
      {"::ffff:127.0.0.0/104", "loopback"},
      {"fe00::/9", "reserved"},
      /* A NAT64 rule is judged on the IPv4 space it carries. */
      {"64:ff9b::/96", NULL},
      {"64:ff9b::7f00:0/104", "loopback"},
      {"64:ff9b::a9fe:a9fe", "cloud metadata"},
      {"198.18.0.0/15", "benchmarking"},
      {"198.18.0.0/14", NULL},
      {"2001:db8::/32", "documentation"},
      {"2001:db8::/31", NULL},
      {"2001::/23", "IETF protocol assignments"},
      {"192.0.0.0/24", "IETF protocol assignments"},
      {"192.0.0.8/31", "IETF protocol assignments"},
      {"2001:20::/28", NULL},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    eg_rule_t r = rule(cases[i].rule);
    const char *got = eg_net_class(&r.addr, r.prefix);
    if ((got == NULL) != (cases[i].cls == NULL) || (got && strcmp(got, cases[i].cls) != 0))
      fail_msg("%s: class %s, expected %s", cases[i].rule, got ? got : "mixed/public",
               cases[i].cls ? cases[i].cls : "mixed/public");
  }
}

/* Item 6 of issue 30: an address is this host's own when the kernel routes it locally, however
 * many addresses the host has and whether an interface or a local route (AnyIP) holds it. */
static int local_in_child(void) {
  if (unshare(CLONE_NEWNET) < 0) return 77;
  if (system("ip link set lo up && ip route add local 192.31.196.0/24 dev lo") != 0) return 77;
  bool v6 = system("ip -6 route add local 2620:4f:8000::/48 dev lo 2>/dev/null") == 0;
  /* More than 256 addresses on an interface: a list of them used to stop at the 256th. */
  FILE *batch = popen("ip -batch -", "w");
  if (!batch) return 77;
  for (int i = 1; i <= 254; i++) fprintf(batch, "addr add 192.52.193.%d/32 dev lo\n", i);
  for (int i = 1; i <= 60; i++) fprintf(batch, "addr add 192.175.48.%d/32 dev lo\n", i);
  if (pclose(batch) != 0) return 77;
  static const struct {
    const char *addr;
    int local;
  } cases[] = {
      {"192.31.196.77", 1},    {"::ffff:192.31.196.1", 1}, {"192.31.197.1", 0},
      {"192.52.193.1", 1},     {"192.175.48.60", 1},       {"192.175.48.61", 0},
      {"2620:4f:8000::77", 1}, {"2620:4f:8001::1", 0},     {"127.0.0.1", 1},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++) {
    if (!v6 && strchr(cases[i].addr, ':') && !strstr(cases[i].addr, "ffff")) continue;
    eg_addr_t a;
    if (eg_addr_parse(cases[i].addr, strlen(cases[i].addr), &a) != 0) return 2;
    int got = eg_addr_is_local(&a);
    if (got != cases[i].local) {
      fprintf(stderr, "%s: local %d, expected %d\n", cases[i].addr, got, cases[i].local);
      return 1;
    }
  }
  return 0;
}

static void test_addr_is_local(void **state) {
  (void)state;
  eg_addr_t lo = addr("127.0.0.1"), lo2 = addr("127.3.4.5"), mapped = addr("::ffff:127.0.0.1"),
            far = addr("192.0.2.1");
  assert_int_equal(eg_addr_is_local(&lo), 1);
  assert_int_equal(eg_addr_is_local(&lo2), 1);
  assert_int_equal(eg_addr_is_local(&mapped), 1);
  assert_int_equal(eg_addr_is_local(&far), 0);
  /* AnyIP and many addresses, in a network namespace of the test's own. */
  if (geteuid() != 0) skip();
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(local_in_child());
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) skip();
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---------------------------------------------------------------- rules */

static void test_rule_parse(void **state) {
  (void)state;
  static const struct {
    const char *in, *text;
    eg_rule_kind_t kind;
  } good[] = {
      {"pypi.org", "pypi.org", EG_RULE_HOST},
      {"PyPI.ORG.", "pypi.org", EG_RULE_HOST},
      {"files.pythonhosted.org:443", "files.pythonhosted.org:443", EG_RULE_HOST},
      {"*.example.com", "*.example.com", EG_RULE_SUFFIX},
      {"*.Example.com:8443", "*.example.com:8443", EG_RULE_SUFFIX},
      {"localhost", "localhost", EG_RULE_HOST},
      {"my_host.lan", "my_host.lan", EG_RULE_HOST},
      {"127.0.0.1", "127.0.0.1", EG_RULE_NET},
      {"127.0.0.1:8080", "127.0.0.1:8080", EG_RULE_NET},
      {"10.1.2.3/8", "10.0.0.0/8", EG_RULE_NET},
      {"10.0.0.0/8:443", "10.0.0.0/8:443", EG_RULE_NET},
      {"::1", "::1", EG_RULE_NET},
      {"[::1]:8080", "[::1]:8080", EG_RULE_NET},
      {"fd00::/8", "fd00::/8", EG_RULE_NET},
      {"[fd00::/8]:443", "[fd00::/8]:443", EG_RULE_NET},
      {"::ffff:127.0.0.1", "127.0.0.1", EG_RULE_NET},
      {"[::ffff:10.0.0.0/104]", "10.0.0.0/8", EG_RULE_NET},
      {"::ffff:0:0/96", "0.0.0.0/0", EG_RULE_NET},
      /* NAT64 stays in its own family. */
      {"64:ff9b::/96", "64:ff9b::/96", EG_RULE_NET},
      {"[64:ff9b::7f00:1]:80", "[64:ff9b::7f00:1]:80", EG_RULE_NET},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(good); i++) {
    eg_rule_t r = rule(good[i].in);
    if (r.kind != good[i].kind || strcmp(r.text, good[i].text) != 0)
      fail_msg("%s: kind %d text %s, expected %d %s", good[i].in, r.kind, r.text, good[i].kind,
               good[i].text);
  }
  static const char *const bad[] = {
      "",       "a..b",        "-a.com",    "a-.com",  "1.2.3.4:0", "1.2.3.4:65536", "*.",
      "*",      "*.*.com",     "h:1:2x",    "1.2.3",   "999.1.1.1", "[1.2.3.4]",     "exa mple.com",
      "a.com:", "10.0.0.0/33", "10.0.0.0/", "::1/129", "[::1",      "[::1]x",        "1.2.3.4/08",
      "123.45", "http://x",    "a@b.com"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++) {
    eg_rule_t r;
    cm_error_t err = CM_ERROR_INIT;
    if (eg_rule_parse(bad[i], strlen(bad[i]), &r, &err) == 0) fail_msg("%s is not a rule", bad[i]);
    assert_int_equal(err.kind, CM_ERR_INVALID);
    cm_error_release(&err);
  }
  char long_label[80];
  memset(long_label, 'a', 64);
  memcpy(long_label + 64, ".com", 5);
  eg_rule_t r;
  cm_error_t err = CM_ERROR_INIT;
  assert_int_equal(eg_rule_parse(long_label, strlen(long_label), &r, &err), -1);
  cm_error_release(&err);
}

static void test_rule_match(void **state) {
  (void)state;
  eg_rule_t h = rule("pypi.org:443"), s = rule("*.example.com"), n = rule("10.0.0.0/8"),
            p = rule("127.0.0.1:8080");
  assert_true(eg_rule_match_name(&h, "pypi.org", 443));
  assert_false(eg_rule_match_name(&h, "pypi.org", 80));
  assert_false(eg_rule_match_name(&h, "xpypi.org", 443));
  assert_true(eg_rule_match_name(&s, "a.example.com", 1));
  assert_true(eg_rule_match_name(&s, "a.b.example.com", 1));
  assert_false(eg_rule_match_name(&s, "example.com", 1));
  assert_false(eg_rule_match_name(&s, "badexample.com", 1));
  eg_addr_t a = addr("10.9.8.7"), m = addr("::ffff:10.9.8.7"), o = addr("11.0.0.1");
  assert_true(eg_rule_match_addr(&n, &a, 5));
  assert_true(eg_rule_match_addr(&n, &m, 5));
  assert_false(eg_rule_match_addr(&n, &o, 5));
  assert_false(eg_rule_match_name(&n, "10.9.8.7", 5));
  eg_addr_t lo = addr("127.0.0.1");
  assert_true(eg_rule_match_addr(&p, &lo, 8080));
  assert_false(eg_rule_match_addr(&p, &lo, 8081));
}

/* ---------------------------------------------------------------- policy */

static bool allows(const eg_policy_t *p, const eg_rule_t *narrow, size_t nn, const char *host,
                   const char *a, uint16_t port, char *why) {
  eg_addr_t ad = addr(a);
  return eg_policy_allows(p, narrow, nn, host, &ad, port, NULL, 0, why, EG_REASON_MAX);
}

static void test_policy_on(void **state) {
  (void)state;
  eg_policy_t p = {.public_internet = true};
  char why[EG_REASON_MAX];
  assert_true(allows(&p, NULL, 0, "example.org", "93.184.216.34", 443, why));
  assert_false(allows(&p, NULL, 0, "evil.test", "127.0.0.1", 80, why));
  assert_string_equal(why, "loopback");
  assert_false(allows(&p, NULL, 0, "169.254.169.254", "169.254.169.254", 80, why));
  assert_string_equal(why, "cloud metadata");
  assert_false(allows(&p, NULL, 0, "x", "::ffff:192.168.0.1", 80, why));
  assert_string_equal(why, "private");
  /* The server's own addresses. */
  eg_addr_t own = addr("8.8.4.4"), dst = addr("8.8.4.4");
  assert_false(eg_policy_allows(&p, NULL, 0, "me", &dst, 8765, &own, 1, why, sizeof why));
  assert_string_equal(why, "this server's own address");
  /* An address rule opens a denied range, for its port only. */
  eg_rule_t r = rule("127.0.0.1:8080");
  eg_policy_add_allow(&p, &r);
  assert_true(allows(&p, NULL, 0, "127.0.0.1", "127.0.0.1", 8080, why));
  assert_false(allows(&p, NULL, 0, "127.0.0.1", "127.0.0.1", 8081, why));
  /* A wider rule does not open it: only a rule that names that address. */
  eg_rule_t wide = rule("8.8.4.0/24");
  eg_policy_add_allow(&p, &wide);
  assert_false(eg_policy_allows(&p, NULL, 0, "me", &dst, 8765, &own, 1, why, sizeof why));
  assert_string_equal(why, "this server's own address");
  eg_rule_t o = rule("8.8.4.4");
  eg_policy_add_allow(&p, &o);
  assert_true(eg_policy_allows(&p, NULL, 0, "me", &dst, 8765, &own, 1, why, sizeof why));
  /* A host rule opens what it resolves to; a suffix rule only public addresses. */
  eg_rule_t db = rule("db.lan"), any = rule("*.corp.test");
  eg_policy_add_allow(&p, &db);
  eg_policy_add_allow(&p, &any);
  assert_true(allows(&p, NULL, 0, "db.lan", "10.0.0.5", 5432, why));
  assert_false(allows(&p, NULL, 0, "x.corp.test", "10.0.0.5", 5432, why));
  assert_false(allows(&p, NULL, 0, "other.lan", "10.0.0.5", 5432, why));
  /* Deny rules win. */
  eg_rule_t d1 = rule("*.example.org"), d2 = rule("93.184.0.0/16"), d3 = rule("127.0.0.1");
  eg_policy_add_deny(&p, &d1);
  eg_policy_add_deny(&p, &d2);
  eg_policy_add_deny(&p, &d3);
  assert_false(allows(&p, NULL, 0, "www.example.org", "8.8.8.8", 443, why));
  assert_non_null(strstr(why, "--network-deny *.example.org"));
  assert_false(allows(&p, NULL, 0, "example.net", "93.184.216.34", 443, why));
  assert_false(allows(&p, NULL, 0, "127.0.0.1", "127.0.0.1", 8080, why));
  assert_int_equal(eg_policy_precheck(&p, NULL, 0, "www.example.org", 443, why, sizeof why), -1);
  assert_int_equal(eg_policy_precheck(&p, NULL, 0, "127.0.0.1", 8080, why, sizeof why), -1);
  assert_int_equal(eg_policy_precheck(&p, NULL, 0, "example.com", 443, why, sizeof why), 0);
  eg_policy_release(&p);
}

static void test_policy_closed_and_narrowed(void **state) {
  (void)state;
  eg_policy_t b = {.public_internet = false, .closed_reason = "not an index host"};
  eg_rule_t i1 = rule("pypi.org:443"), i2 = rule("127.0.0.1:3141"),
            i3 = rule("files.pythonhosted.org:443");
  eg_policy_add_allow(&b, &i1);
  eg_policy_add_allow(&b, &i2);
  eg_policy_add_allow(&b, &i3);
  char why[EG_REASON_MAX];
  assert_int_equal(eg_policy_precheck(&b, NULL, 0, "pypi.org", 443, why, sizeof why), 0);
  assert_int_equal(eg_policy_precheck(&b, NULL, 0, "evil.test", 443, why, sizeof why), -1);
  assert_string_equal(why, "not an index host");
  assert_int_equal(eg_policy_precheck(&b, NULL, 0, "pypi.org", 80, why, sizeof why), -1);
  assert_true(allows(&b, NULL, 0, "pypi.org", "151.101.0.223", 443, why));
  assert_false(allows(&b, NULL, 0, "8.8.8.8", "8.8.8.8", 443, why));
  assert_string_equal(why, "not an index host");
  assert_true(allows(&b, NULL, 0, "127.0.0.1", "127.0.0.1", 3141, why));
  assert_false(allows(&b, NULL, 0, "127.0.0.1", "127.0.0.1", 5432, why));
  assert_string_equal(why, "not an index host (loopback)");
  eg_policy_release(&b);

  eg_policy_t on = {.public_internet = true};
  eg_rule_t narrow[] = {rule("api.example.com"), rule("93.184.216.0/24")};
  assert_int_equal(eg_policy_precheck(&on, narrow, 2, "api.example.com", 443, why, sizeof why), 0);
  assert_int_equal(eg_policy_precheck(&on, narrow, 2, "other.example.com", 443, why, sizeof why),
                   -1);
  assert_string_equal(why, "not in this call's network list");
  assert_int_equal(eg_policy_precheck(&on, narrow, 2, "93.184.216.1", 80, why, sizeof why), 0);
  assert_true(allows(&on, narrow, 2, "93.184.216.1", "93.184.216.1", 80, why));
  assert_false(allows(&on, narrow, 2, "8.8.8.8", "8.8.8.8", 53, why));
  /* Narrowing never widens: a listed name that resolves to loopback stays denied. */
  eg_rule_t lo[] = {rule("localhost")};
  assert_false(allows(&on, lo, 1, "localhost", "127.0.0.1", 80, why));
  assert_string_equal(why, "loopback");
}

static void test_policy_narrowing_ok(void **state) {
  (void)state;
  eg_policy_t on = {.public_internet = true};
  char why[EG_REASON_MAX];
  eg_rule_t r;
  r = rule("127.0.0.1");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  assert_non_null(strstr(why, "loopback"));
  r = rule("10.0.0.0/8");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("169.254.169.254:80");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("0.0.0.0/0");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("example.com");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("93.184.216.34");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  /* Special-purpose ranges are denied like private ones, unless a rule names them. */
  r = rule("198.51.100.1");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  assert_non_null(strstr(why, "documentation"));
  r = rule("198.18.0.0/15");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  eg_rule_t open = rule("127.0.0.1:8080");
  eg_policy_add_allow(&on, &open);
  r = rule("127.0.0.1:8080");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("127.0.0.1");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why)); /* port 8080 of it */
  r = rule("127.0.0.1:9");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  eg_rule_t d = rule("*.evil.test");
  eg_policy_add_deny(&on, &d);
  r = rule("a.evil.test");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  assert_non_null(strstr(why, "--network-deny *.evil.test"));
  r = rule("*.x.evil.test");
  assert_false(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  r = rule("evil.test");
  assert_true(eg_policy_narrowing_ok(&on, &r, why, sizeof why));
  eg_policy_release(&on);
}

/* Item 7 of issue 30: a wide or NAT64/mapped rule never widens into a denied range. */
static void test_policy_wide_rules(void **state) {
  (void)state;
  char why[EG_REASON_MAX];
  eg_policy_t on = {.public_internet = true};
  eg_rule_t nat64 = rule("64:ff9b::/96");
  eg_policy_add_allow(&on, &nat64);
  assert_false(allows(&on, NULL, 0, "x", "127.0.0.1", 80, why));
  assert_string_equal(why, "loopback");
  assert_false(allows(&on, NULL, 0, "x", "169.254.169.254", 80, why));
  assert_string_equal(why, "cloud metadata");
  assert_false(allows(&on, NULL, 0, "x", "64:ff9b::7f00:1", 80, why));
  assert_string_equal(why, "loopback");
  assert_false(allows(&on, NULL, 0, "x", "64:ff9b::a9fe:a9fe", 80, why));
  assert_false(allows(&on, NULL, 0, "x", "::ffff:169.254.169.254", 80, why));
  assert_true(allows(&on, NULL, 0, "x", "8.8.8.8", 80, why));
  eg_policy_release(&on);

  eg_policy_t closed = {.public_internet = false};
  nat64 = rule("64:ff9b::/96");
  eg_policy_add_allow(&closed, &nat64);
  assert_true(allows(&closed, NULL, 0, "x", "64:ff9b::808:808", 80, why));
  /* In its own family: a NAT64 rule is not every IPv4 destination. */
  assert_false(allows(&closed, NULL, 0, "x", "8.8.8.8", 80, why));
  assert_false(allows(&closed, NULL, 0, "x", "64:ff9b::7f00:1", 80, why));
  assert_false(allows(&closed, NULL, 0, "x", "64:ff9b::a9fe:a9fe", 80, why));
  eg_policy_release(&closed);

  static const char *const wide[] = {"::ffff:0:0/96", "0.0.0.0/0",         "::/0", "::/96",
                                     "0.0.0.0/1",     "::ffff:0.0.0.0/97", "::/1"};
  static const char *const never[] = {
      "127.0.0.1",   "::1",        "::ffff:127.0.0.1", "169.254.169.254", "::ffff:169.254.169.254",
      "169.254.1.1", "fe80::1",    "10.0.0.1",         "::ffff:10.0.0.1", "fd00:ec2::254",
      "0.0.0.0",     "198.18.0.1", "2001:db8::1",      "::127.0.0.1"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(wide); i++) {
    eg_policy_t p = {.public_internet = false};
    eg_rule_t w = rule(wide[i]);
    eg_policy_add_allow(&p, &w);
    for (size_t j = 0; j < CM_ARRAY_SIZE(never); j++)
      if (allows(&p, NULL, 0, "x", never[j], 80, why))
        fail_msg("--network-allow %s opens %s", wide[i], never[j]);
    /* Narrowing to it under a policy that opens only that rule: refused where it is denied. */
    eg_rule_t lo = rule("127.0.0.1");
    assert_false(eg_policy_narrowing_ok(&p, &lo, why, sizeof why));
    eg_policy_release(&p);
  }
  eg_policy_t p = {.public_internet = false};
  eg_rule_t any4 = rule("0.0.0.0/0");
  eg_policy_add_allow(&p, &any4);
  assert_true(allows(&p, NULL, 0, "x", "8.8.8.8", 80, why));
  assert_true(allows(&p, NULL, 0, "x", "::ffff:8.8.8.8", 80, why));
  eg_policy_release(&p);

  /* A rule that names a range opens it, and only the class it names. */
  static const struct {
    const char *rule, *addr;
    bool open;
  } named[] = {
      {"127.0.0.0/8", "127.0.0.1", true},
      {"::ffff:127.0.0.0/104", "127.0.0.1", true},
      {"10.0.0.0/8", "10.1.2.3", true},
      {"10.0.0.0/7", "10.1.2.3", false},
      {"10.0.0.0/7", "11.1.2.3", true},
      {"169.254.0.0/16", "169.254.1.1", true},
      {"169.254.0.0/16", "169.254.169.254", false},
      {"169.254.169.254", "169.254.169.254", true},
      {"100.64.0.0/10", "100.100.100.200", false},
      {"64:ff9b::7f00:1", "64:ff9b::7f00:1", true},
      {"198.18.0.0/15", "198.18.0.1", true},
      {"198.51.100.0/24", "198.51.100.1", true},
      {"2001:db8::/32", "2001:db8::1", true},
      {"2001::/16", "2001:db8::1", false},
      {"fe80::/10", "fe80::1", true},
      {"::1", "::1", true},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(named); i++) {
    eg_policy_t q = {.public_internet = true};
    eg_rule_t r = rule(named[i].rule);
    eg_policy_add_allow(&q, &r);
    if (allows(&q, NULL, 0, "x", named[i].addr, 80, why) != named[i].open)
      fail_msg("--network-allow %s %s %s", named[i].rule, named[i].open ? "does not open" : "opens",
               named[i].addr);
    eg_policy_release(&q);
  }
  /* A call's list within such a rule: allowed only where the rule names the range. */
  eg_policy_t q = {.public_internet = true};
  eg_rule_t docs = rule("198.51.100.0/24"), any = rule("0.0.0.0/0");
  eg_policy_add_allow(&q, &docs);
  eg_policy_add_allow(&q, &any);
  eg_rule_t call = rule("198.51.100.7:80");
  assert_true(eg_policy_narrowing_ok(&q, &call, why, sizeof why));
  call = rule("127.0.0.1");
  assert_false(eg_policy_narrowing_ok(&q, &call, why, sizeof why));
  eg_policy_release(&q);
}

/* Item 10 of issue 30: a name rule denies the destination that name is. */
static void test_policy_deny_resolved(void **state) {
  (void)state;
  eg_policy_t p = {.public_internet = true};
  eg_rule_t d1 = rule("evil.example"), d2 = rule("db.example:5432"), d3 = rule("*.bad.example"),
            d4 = rule("93.184.0.0/16");
  eg_policy_add_deny(&p, &d1);
  eg_policy_add_deny(&p, &d2);
  eg_policy_add_deny(&p, &d3);
  eg_policy_add_deny(&p, &d4);
  assert_true(eg_rule_deny_resolves(&p.deny[0], 443));
  assert_true(eg_rule_deny_resolves(&p.deny[1], 5432));
  assert_false(eg_rule_deny_resolves(&p.deny[1], 443));
  assert_false(eg_rule_deny_resolves(&p.deny[2], 443)); /* a suffix names no address */
  assert_false(eg_rule_deny_resolves(&p.deny[3], 443));
  eg_name_addr_t resolved[] = {
      {0, addr("8.8.8.8")}, {0, addr("2001:4860::1")}, {1, addr("1.1.1.1")}, {9, addr("9.9.9.9")}};
  eg_addr_t a = addr("8.8.8.8"), m = addr("::ffff:8.8.8.8"), v6 = addr("2001:4860::1"),
            other = addr("8.8.4.4"), db = addr("1.1.1.1"), stray = addr("9.9.9.9");
  const eg_rule_t *hit = eg_policy_deny_resolved(&p, resolved, 4, &a, 443);
  assert_non_null(hit);
  assert_string_equal(hit->text, "evil.example");
  assert_non_null(eg_policy_deny_resolved(&p, resolved, 4, &m, 80));
  assert_non_null(eg_policy_deny_resolved(&p, resolved, 4, &v6, 80));
  assert_null(eg_policy_deny_resolved(&p, resolved, 4, &other, 443));
  /* A rule with a port denies its name's addresses at that port only. */
  assert_non_null(eg_policy_deny_resolved(&p, resolved, 4, &db, 5432));
  assert_null(eg_policy_deny_resolved(&p, resolved, 4, &db, 443));
  /* An index out of the policy's list is ignored. */
  assert_null(eg_policy_deny_resolved(&p, resolved, 4, &stray, 443));
  assert_null(eg_policy_deny_resolved(&p, NULL, 0, &a, 443));
  eg_policy_release(&p);
}

/* ---------------------------------------------------------------- HTTP */

static int parse_req(const char *s, eg_request_t *req) {
  return eg_http_parse_request(s, strlen(s), req);
}

static void test_http_request(void **state) {
  (void)state;
  eg_request_t *req = malloc(sizeof *req);
  const char *c = "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n";
  assert_int_equal(parse_req(c, req), 1);
  assert_int_equal(req->form, EG_FORM_AUTHORITY);
  assert_string_equal(req->host, "pypi.org");
  assert_int_equal(req->port, 443);
  assert_int_equal(req->head_len, strlen(c));
  assert_int_equal(parse_req("CONNECT [::1]:8080 HTTP/1.1\r\n\r\n", req), 1);
  assert_string_equal(req->host, "::1");
  assert_int_equal(parse_req("CONNECT 198.51.100.1:80 HTTP/1.0\r\n\r\n", req), 1);
  assert_int_equal(req->minor_version, 0);
  const char *g =
      "GET http://Example.COM/a/b?q=1#frag HTTP/1.1\r\nHost: example.com\r\nAccept: "
      "*/*\r\n\r\nBODY";
  assert_int_equal(parse_req(g, req), 1);
  assert_int_equal(req->form, EG_FORM_ABSOLUTE);
  assert_string_equal(req->host, "example.com");
  assert_int_equal(req->port, 80);
  assert_int_equal(req->path.len, strlen("/a/b?q=1"));
  assert_int_equal(req->n_headers, 2);
  assert_int_equal(req->head_len, strlen(g) - 4);
  assert_int_equal(parse_req("GET http://h:8080 HTTP/1.1\r\n\r\n", req), 1);
  assert_int_equal(req->port, 8080);
  assert_int_equal(req->path.len, 0);
  assert_int_equal(parse_req("GET /simple/ HTTP/1.1\r\nHost: 127.0.1.1:3128\r\n\r\n", req), 1);
  assert_int_equal(req->form, EG_FORM_ORIGIN);
  /* Incomplete, then malformed ones. */
  assert_int_equal(parse_req("CONNECT pypi.org:443 HTTP/1.1\r\nHost: x\r\n", req), 0);
  assert_int_equal(parse_req("", req), 0);
  static const char *const bad[] = {
      "CONNECT pypi.org HTTP/1.1\r\n\r\n",
      "CONNECT pypi.org:0 HTTP/1.1\r\n\r\n",
      "GET https://pypi.org/ HTTP/1.1\r\n\r\n",
      "GET ftp://x/ HTTP/1.1\r\n\r\n",
      "GET http://u:p@x/ HTTP/1.1\r\n\r\n",
      "GET * HTTP/1.1\r\n\r\n",
      "GET http://x/ HTTP/2.0\r\n\r\n",
      "GET http://x/ HTTP/1.1\r\nBad Header: 1\r\n\r\n",
      "GET http://x/ HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n",
      "GET http://x/ HTTP/1.1\r\nA: \x01\r\n\r\n",
      "G@T http://x/ HTTP/1.1\r\n\r\n",
      "GET  http://x/ HTTP/1.1\r\n\r\n",
      "GET http://exa mple/ HTTP/1.1\r\n\r\n",
      "GET http://-bad-/ HTTP/1.1\r\n\r\n",
      "CONNECT [1.2.3.4]:80 HTTP/1.1\r\n\r\n",
      "GET http://x/ HTTP/1.1\nA: b\n\n",
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (parse_req(bad[i], req) != -1) fail_msg("accepted: %s", bad[i]);
  /* Too large without an end. */
  char *big = malloc(EG_HEAD_MAX + 10);
  memcpy(big, "GET http://x/ HTTP/1.1\r\nA: ", 27);
  memset(big + 27, 'a', EG_HEAD_MAX - 17);
  assert_int_equal(eg_http_parse_request(big, EG_HEAD_MAX + 10, req), -1);
  free(big);
  free(req);
}

static void test_http_forward(void **state) {
  (void)state;
  eg_request_t *req = malloc(sizeof *req);
  const char *g =
      "POST http://example.com:8080/up HTTP/1.1\r\nHost: wrong\r\nProxy-Connection: keep-alive\r\n"
      "Connection: keep-alive, X-Secret, Content-Length\r\nX-Secret: s\r\nProxy-Authorization: "
      "Basic x\r\n"
      "Content-Length: 4\r\nAuthorization: Bearer t\r\nUser-Agent: pip\r\n\r\nbody";
  assert_int_equal(parse_req(g, req), 1);
  cm_buf_t out;
  cm_buf_init(&out, 0);
  eg_http_forward_head(g, req, NULL, 0, "example.com:8080", NULL, 0, &out);
  assert_string_equal(
      out.data,
      "POST /up HTTP/1.1\r\nContent-Length: 4\r\nAuthorization: Bearer t\r\nUser-Agent: pip\r\n"
      "Host: example.com:8080\r\nConnection: close\r\n\r\n");
  cm_buf_reset(&out);
  eg_http_forward_head(g, req, "/simple/x/", 10, "idx.test", "Basic dTpw", 0, &out);
  assert_non_null(strstr(out.data, "POST /simple/x/ HTTP/1.1\r\n"));
  assert_non_null(strstr(out.data, "Authorization: Basic dTpw\r\n"));
  assert_null(strstr(out.data, "Bearer"));
  cm_buf_release(&out);

  eg_response_t resp;
  const char *r =
      "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: keep-alive\r\nKeep-Alive: "
      "timeout=5\r\n"
      "Transfer-Encoding: chunked\r\n\r\n5\r\nhello";
  assert_int_equal(eg_http_parse_response(r, strlen(r), &resp), 1);
  assert_int_equal(resp.status, 200);
  cm_buf_init(&out, 0);
  eg_http_forward_response(r, &resp, false, &out);
  assert_string_equal(out.data,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n"
                      "Connection: close\r\n\r\n");
  cm_buf_release(&out);
  /* The answer to a request with the server's credentials keeps no cookie. */
  const char *rc = "HTTP/1.1 200 OK\r\nSet-Cookie: s=1\r\nX-A: b\r\nSET-COOKIE2: t=2\r\n\r\n";
  assert_int_equal(eg_http_parse_response(rc, strlen(rc), &resp), 1);
  cm_buf_init(&out, 0);
  eg_http_forward_response(rc, &resp, true, &out);
  assert_string_equal(out.data, "HTTP/1.1 200 OK\r\nX-A: b\r\nConnection: close\r\n\r\n");
  cm_buf_release(&out);
  cm_buf_init(&out, 0);
  eg_http_forward_response(rc, &resp, false, &out);
  assert_non_null(strstr(out.data, "Set-Cookie: s=1\r\n"));
  cm_buf_release(&out);
  assert_int_equal(eg_http_parse_response("HTTP/1.1 200", 12, &resp), 0);
  assert_int_equal(eg_http_parse_response("HTTX/1.1 200 OK\r\n\r\n", 19, &resp), -1);
  assert_int_equal(eg_http_parse_response("HTTP/1.1 2x0 OK\r\n\r\n", 19, &resp), -1);
  free(req);
}

/* Interim (1xx) heads before the final one: each rewritten, in pieces of any size. */
static void test_http_interim_heads(void **state) {
  (void)state;
  const char *r =
      "HTTP/1.1 100 Continue\r\nSet-Cookie: a=1\r\nKeep-Alive: timeout=5\r\n\r\n"
      "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nSet-Cookie: b=2\r\n"
      "Connection: X-Hop\r\nX-Hop: h\r\n\r\n"
      "HTTP/1.1 200 OK\r\nSet-Cookie: c=3\r\nX-Hop2: y\r\nConnection: X-Hop2\r\nContent-Length: "
      "2\r\n\r\nok";
  const char *want_cookieless =
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n";
  size_t len = strlen(r);
  eg_response_t resp;
  size_t used = 0, final_off = 0;
  cm_buf_t out;
  cm_buf_init(&out, 0);
  assert_int_equal(eg_http_rewrite_heads(r, len, true, &out, &used, &resp, &final_off), 1);
  assert_string_equal(out.data, want_cookieless);
  assert_int_equal(used, len - 2);
  assert_int_equal(resp.status, 200);
  assert_memory_equal(r + final_off, "HTTP/1.1 200 OK", 15);
  cm_buf_reset(&out);
  assert_int_equal(eg_http_rewrite_heads(r, len, false, &out, &used, &resp, &final_off), 1);
  assert_non_null(strstr(out.data, "Set-Cookie: a=1\r\n"));
  assert_non_null(strstr(out.data, "Set-Cookie: c=3\r\n"));
  assert_null(strstr(out.data, "X-Hop"));
  assert_null(strstr(out.data, "Keep-Alive"));
  cm_buf_release(&out);
  /* As the proxy gets it: a piece at a time, interim heads passed on as they complete. */
  for (size_t step = 1; step < len; step++) {
    char buf[1024];
    size_t have = 0, fed = 0;
    cm_buf_t all;
    cm_buf_init(&all, 0);
    int rc = 0;
    while (rc == 0 && fed < len) {
      size_t n = CM_MIN(step, len - fed);
      memcpy(buf + have, r + fed, n);
      have += n;
      fed += n;
      rc = eg_http_rewrite_heads(buf, have, true, &all, &used, &resp, &final_off);
      assert_true(rc >= 0);
      if (rc == 0) {
        memmove(buf, buf + used, have - used);
        have -= used;
      }
    }
    assert_int_equal(rc, 1);
    assert_string_equal(all.data, want_cookieless);
    cm_buf_release(&all);
  }
  /* No final head yet: the interim ones are consumed. */
  cm_buf_init(&out, 0);
  assert_int_equal(eg_http_rewrite_heads(r, 30, true, &out, &used, &resp, &final_off), 0);
  assert_int_equal(used, 0);
  assert_int_equal(eg_http_rewrite_heads(r, 80, true, &out, &used, &resp, &final_off), 0);
  assert_int_equal(
      used, strlen("HTTP/1.1 100 Continue\r\nSet-Cookie: a=1\r\nKeep-Alive: timeout=5\r\n\r\n"));
  assert_string_equal(out.data, "HTTP/1.1 100 Continue\r\n\r\n");
  cm_buf_release(&out);
  /* A switch of protocols, and a malformed head after an interim one: refused. */
  cm_buf_init(&out, 0);
  const char *up = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n";
  assert_int_equal(eg_http_rewrite_heads(up, strlen(up), true, &out, &used, &resp, &final_off), -1);
  const char *bad = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2x0 OK\r\n\r\n";
  assert_int_equal(eg_http_rewrite_heads(bad, strlen(bad), true, &out, &used, &resp, &final_off),
                   -1);
  cm_buf_release(&out);
  /* A credentialed request goes without Expect. */
  eg_request_t *req = malloc(sizeof *req);
  const char *g = "GET /simple/ HTTP/1.1\r\nExpect: 100-continue\r\nAccept: */*\r\n\r\n";
  assert_int_equal(eg_http_parse_request(g, strlen(g), req), 1);
  cm_buf_init(&out, 0);
  eg_http_forward_head(g, req, NULL, 0, "idx.test", "Basic dTpw", 0, &out);
  assert_null(strstr(out.data, "Expect"));
  cm_buf_reset(&out);
  eg_http_forward_head(g, req, NULL, 0, "idx.test", NULL, 0, &out);
  assert_non_null(strstr(out.data, "Expect: 100-continue\r\n"));
  cm_buf_release(&out);
  free(req);
}

/* ---------------------------------------------------------------- an index's links */

static bool below(const char *base, const char *target) {
  return eg_index_path_below(base, target, strlen(target));
}

static void test_index_path_below(void **state) {
  (void)state;
  const char *base = "/api/v4/projects/1/packages/pypi/simple";
  static const char *const yes[] = {
      "/api/v4/projects/1/packages/pypi/simple",
      "/api/v4/projects/1/packages/pypi/simple/",
      "/api/v4/projects/1/packages/pypi/simple/mps-x/",
      "/api/v4/projects/1/packages/pypi/simple/mps-x/?format=json",
      "/api/v4/projects/1/packages/pypi/simple?x=../..",
      "/api/v4/projects/1/packages/pypi/simple/a%2Bb/",
  };
  static const char *const no[] = {
      "/api/v4/private/token",
      "/api/v4/projects/1/packages/pypi/simpler",
      "/api/v4/projects/1/packages/pypi/simple/../../../../private",
      "/api/v4/projects/1/packages/pypi/simple/..",
      "/api/v4/projects/1/packages/pypi/simple/./x",
      "/api/v4/projects/1/packages/pypi/simple/..;/x",
      "/api/v4/projects/1/packages/pypi/simple/%2e%2e/x",
      "/api/v4/projects/1/packages/pypi/simple/%2E./x",
      "/api/v4/projects/1/packages/pypi/simple/x%2f..%2f..%2fy",
      "/api/v4/projects/1/packages/pypi/simple/x%5c..",
      "/api/v4/projects/1/packages/pypi/simple/x\\..\\y",
      "/api/v4/projects/1/packages/pypi/simple/%252e%252e/",
      "/api/v4/projects/1/packages/pypi/simple/%00",
      "/api/v4/projects/1/packages/pypi/simple/%zz",
      "/api/v4/projects/1/packages/pypi/simple/%2",
      "api/v4/projects/1/packages/pypi/simple/",
      "",
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(yes); i++)
    if (!below(base, yes[i])) fail_msg("%s is below %s", yes[i], base);
  for (size_t i = 0; i < CM_ARRAY_SIZE(no); i++)
    if (below(base, no[i])) fail_msg("%s is not below %s", no[i], base);
  /* A base with a trailing slash or a query is the same base; the root covers the host. */
  assert_true(below("/simple/", "/simple"));
  assert_true(below("/simple/?x", "/simple/a/"));
  assert_false(below("/simple/", "/simplex"));
  assert_true(below("/", "/anything/at/all"));
  assert_false(below("/", "/a/../b"));
  /* An encoded slash in the operator's own base is the operator's. */
  assert_true(below("/api/v4/projects/g%2Fp/packages/pypi/simple",
                    "/api/v4/projects/g%2Fp/packages/pypi/simple/x/"));
  /* The length is honoured. */
  assert_true(eg_index_path_below("/simple", "/simple/x/../../private", 9));
}

static void check_canon(const char *in, const char *want) {
  char *got = eg_path_canon(in, strlen(in));
  if (strcmp(got, want) != 0) fail_msg("canon(%s) = %s, want %s", in, got, want);
  free(got);
}

static void check_resolve(const eg_url_t *origin, const char *page, const char *link,
                          const char *want) {
  char *got = eg_link_resolve(origin, page, link, strlen(link));
  if (!want && got) fail_msg("%s on %s resolved to %s, want none", link, page, got);
  if (want && (!got || strcmp(got, want) != 0))
    fail_msg("%s on %s resolved to %s, want %s", link, page, got ? got : "(none)", want);
  free(got);
}

static void test_links(void **state) {
  (void)state;
  check_canon("/files/a+b.whl", "/files/a+b.whl");
  check_canon("/files/a%2Bb.whl", "/files/a+b.whl");
  check_canon("/files/a%2bb.whl", "/files/a+b.whl");
  check_canon("/files/a b%7e", "/files/a%20b~");
  check_canon("/f/%2F/%2e/%3F/%25?q=%3f&r", "/f/%2F/%2E/%3F/%25?q=%3F&r");
  check_canon("/f/%zz%4", "/f/%25zz%254");

  eg_url_t origin;
  const char *url = "https://u:p@Index.test:8443/api/v4/projects/1/packages/pypi/simple";
  assert_int_equal(eg_url_parse(url, strlen(url), &origin), 0);
  const char *page = "/api/v4/projects/1/packages/pypi/simple/mps-x/";
  check_resolve(&origin, page, "../../files/abc/mps_x-1.0.tar.gz#sha256=00",
                "/api/v4/projects/1/packages/pypi/files/abc/mps_x-1.0.tar.gz");
  check_resolve(&origin, page, "mps_x-1.0.whl",
                "/api/v4/projects/1/packages/pypi/simple/mps-x/mps_x-1.0.whl");
  check_resolve(&origin, page, " /files/x.whl ", "/files/x.whl");
  check_resolve(&origin, page, "/a/./b/../c/", "/a/c/");
  check_resolve(&origin, page, "../../../../../../../../x", "/x");
  check_resolve(&origin, page, "?page=2", "/api/v4/projects/1/packages/pypi/simple/mps-x/?page=2");
  check_resolve(&origin, "/simple/x?a=b", "y.whl", "/simple/y.whl");
  check_resolve(&origin, page, "https://INDEX.test:8443/files/x.whl?t=1", "/files/x.whl?t=1");
  check_resolve(&origin, page, "//index.test:8443/files/x.whl", "/files/x.whl");
  check_resolve(&origin, page, "https://index.test:8443", "/");
  /* Other origins, schemes, credentials in the link, control characters: none. */
  check_resolve(&origin, page, "https://index.test/files/x.whl", NULL);
  check_resolve(&origin, page, "http://index.test:8443/files/x.whl", NULL);
  check_resolve(&origin, page, "https://files.example/x.whl", NULL);
  check_resolve(&origin, page, "//evil.test/x", NULL);
  check_resolve(&origin, page, "https://a:b@index.test:8443/x", NULL);
  check_resolve(&origin, page, "javascript:alert(1)", NULL);
  check_resolve(&origin, page, "mailto:x@y", NULL);
  check_resolve(&origin, page, "x\ny", NULL);
  check_resolve(&origin, page, "#frag", NULL);
  check_resolve(&origin, page, "", NULL);
  eg_url_release(&origin);

  /* The set: canonical, bounded, the oldest first out. */
  eg_link_set_t *set = eg_link_set_new(3, 1000);
  eg_link_set_add(set, "/files/a+b.whl", 14);
  assert_true(eg_link_set_has(set, "/files/a%2Bb.whl", 16));
  assert_true(eg_link_set_has(set, "/files/a+b.whl", 14));
  assert_false(eg_link_set_has(set, "/files/a+b.wh", 13));
  eg_link_set_add(set, "/files/a%2bb.whl", 16); /* the same link */
  assert_int_equal(eg_link_set_count(set), 1);
  eg_link_set_add(set, "/2", 2);
  eg_link_set_add(set, "/3", 2);
  eg_link_set_add(set, "/4", 2);
  assert_int_equal(eg_link_set_count(set), 3);
  assert_false(eg_link_set_has(set, "/files/a+b.whl", 14));
  assert_true(eg_link_set_has(set, "/2", 2) && eg_link_set_has(set, "/4", 2));
  eg_link_set_free(set);
  set = eg_link_set_new(100, 10);
  eg_link_set_add(set, "/123456", 7);
  eg_link_set_add(set, "/1234", 5); /* 12 bytes: the first goes */
  assert_false(eg_link_set_has(set, "/123456", 7));
  assert_true(eg_link_set_has(set, "/1234", 5));
  eg_link_set_add(set, "/12345678901", 12); /* longer than the whole bound: never kept */
  assert_false(eg_link_set_has(set, "/12345678901", 12));
  assert_true(eg_link_set_has(set, "/1234", 5));
  eg_link_set_free(set);

  /* The decision: below the index's path, or a link (or its PEP 658 metadata) asked for
   * without dot segments. */
  const char *base = "/api/v4/projects/1/packages/pypi/simple";
  set = eg_link_set_new(100, 100000);
  const char *file = "/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar.gz";
  eg_link_set_add(set, file, strlen(file));
  static const struct {
    const char *target;
    bool ok;
  } cases[] = {
      {"/api/v4/projects/1/packages/pypi/simple/x/", true},
      {"/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar.gz", true},
      {"/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar.gz.metadata", true},
      {"/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar%2Egz", false}, /* %2E stays */
      {"/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar.gz?x", false},
      {"/api/v4/projects/1/packages/pypi/files/abc/x-1.0.tar.gz.metadata?x", false},
      {"/api/v4/projects/1/packages/pypi/files/abc/y-1.0.tar.gz", false},
      {"/api/v4/projects/1/packages/pypi/files/abc/../abc/x-1.0.tar.gz", false},
      {"/api/v4/private/token", false},
      {"/", false},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(cases); i++)
    if (eg_index_credentials_apply(base, set, cases[i].target, strlen(cases[i].target)) !=
        cases[i].ok)
      fail_msg("credentials for %s: want %d", cases[i].target, cases[i].ok);
  assert_false(eg_index_credentials_apply(base, NULL, file, strlen(file)));
  eg_link_set_free(set);
}

typedef struct found {
  char links[16][256];
  size_t n;
} found_t;

static void on_link(void *data, const char *link, size_t len) {
  found_t *f = data;
  if (f->n < 16 && len < 256) {
    memcpy(f->links[f->n], link, len);
    f->links[f->n][len] = '\0';
  }
  f->n++;
}

/* Scans body in pieces of step bytes; checks the links found. */
static void check_scan(const char *body, bool chunked, size_t step, const char *const *want,
                       size_t n_want) {
  eg_page_scan_t *s = malloc(sizeof *s);
  eg_page_scan_init(s, chunked);
  found_t f = {.n = 0};
  size_t len = strlen(body);
  for (size_t i = 0; i < len; i += step)
    assert_int_equal(eg_page_scan_feed(s, body + i, CM_MIN(step, len - i), on_link, &f), 0);
  if (f.n != n_want) fail_msg("%zu links in pieces of %zu, want %zu", f.n, step, n_want);
  for (size_t i = 0; i < n_want; i++)
    if (strcmp(f.links[i], want[i]) != 0)
      fail_msg("link %zu is %s, want %s (pieces of %zu)", i, f.links[i], want[i], step);
  free(s);
}

static void test_page_scan(void **state) {
  (void)state;
  const char *html =
      "<!DOCTYPE html><html><body><h1>Links for x</h1>\n"
      "<a href=\"../../files/a/x-1.0.tar.gz#sha256=00\" data-requires-python=\"&gt;=3.8\">x</a>\n"
      "<A HREF='x-1.1.whl'>x</A><a href = x-1.2.whl>x</a><a href=x.whl?a=1&amp;b=2>\n"
      "<a\thref\n=\n\"\">empty</a> href without a value; hrefx=\"no\" <a href=\"/f/\\\"\">\n";
  static const char *const html_links[] = {"../../files/a/x-1.0.tar.gz#sha256=00", "x-1.1.whl",
                                           "x-1.2.whl", "x.whl?a=1&b=2", "/f/\\"};
  for (size_t step = 1; step <= strlen(html); step++)
    check_scan(html, false, step, html_links, CM_ARRAY_SIZE(html_links));
  const char *json =
      "{\"meta\":{\"api-version\":\"1.1\"},\"name\":\"x\",\"files\":[{\"filename\":\"x.whl\","
      "\"url\" : \"..\\/..\\/files\\/x.whl\",\"hashes\":{}},{\"url\":\"\\u002fx\"},"
      "{\"url\":\"https://f.test/\\\"q\\\\\"},{\"url\": 5}]}";
  static const char *const json_links[] = {"../../files/x.whl", "https://f.test/\"q\\"};
  for (size_t step = 1; step <= strlen(json); step++)
    check_scan(json, false, step, json_links, CM_ARRAY_SIZE(json_links));
  /* Chunked: the framing is undone first (a link across chunks is whole). */
  const char *chunked =
      "7\r\n<a href\r\n6;ext=1\r\n=\"/a/b\r\n3\r\n\">x\r\n0\r\nT: 1\r\n\r\n<a href=/no>";
  static const char *const chunked_links[] = {"/a/b"};
  for (size_t step = 1; step <= strlen(chunked); step++)
    check_scan(chunked, true, step, chunked_links, 1);
  /* Broken framing stops the scan. */
  eg_page_scan_t *s = malloc(sizeof *s);
  found_t f = {.n = 0};
  eg_page_scan_init(s, true);
  assert_int_equal(eg_page_scan_feed(s, "zz\r\n", 4, on_link, &f), -1);
  eg_page_scan_init(s, true);
  assert_int_equal(eg_page_scan_feed(s, "2\r\nabX", 6, on_link, &f), -1);
  eg_page_scan_init(s, true);
  assert_int_equal(eg_page_scan_feed(s, "1234567890abcdef0\r\n", 19, on_link, &f), -1);
  /* A link longer than EG_LINK_MAX is skipped, the next one found. */
  eg_page_scan_init(s, false);
  char *big = malloc(EG_LINK_MAX + 64);
  size_t o = (size_t)sprintf(big, "<a href=\"");
  memset(big + o, 'a', EG_LINK_MAX + 1);
  o += EG_LINK_MAX + 1;
  o += (size_t)sprintf(big + o, "\"><a href=\"/ok\">");
  assert_int_equal(eg_page_scan_feed(s, big, o, on_link, &f), 0);
  assert_int_equal(f.n, 1);
  assert_string_equal(f.links[0], "/ok");
  free(big);
  free(s);

  /* Which answers are learnt. */
  static const struct {
    const char *head;
    bool learnt, chunked;
  } heads[] = {
      {"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n", true, false},
      {"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\n\r\n", true, false},
      {"HTTP/1.1 200 OK\r\nContent-Type: TEXT/HTML\r\nTransfer-Encoding: chunked\r\n\r\n", true,
       true},
      {"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: identity\r\n\r\n", true,
       false},
      {"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n\r\n", false,
       false},
      {"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
       false, false},
      {"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n", false, false},
      {"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Type: text/plain\r\n\r\n", false,
       false},
      {"HTTP/1.1 200 OK\r\n\r\n", false, false},
      {"HTTP/1.1 206 Partial\r\nContent-Type: text/html\r\n\r\n", false, false},
      {"HTTP/1.1 304 Not Modified\r\nContent-Type: text/html\r\n\r\n", false, false},
      {"HTTP/1.1 401 No\r\nContent-Type: text/html\r\n\r\n", false, false},
  };
  for (size_t i = 0; i < CM_ARRAY_SIZE(heads); i++) {
    eg_response_t resp;
    assert_int_equal(eg_http_parse_response(heads[i].head, strlen(heads[i].head), &resp), 1);
    bool chunked_flag = false;
    if (eg_page_response_learnable(heads[i].head, &resp, &chunked_flag) != heads[i].learnt ||
        (heads[i].learnt && chunked_flag != heads[i].chunked))
      fail_msg("learnable(%s)", heads[i].head);
  }

  /* A page request goes without what would make its answer partial, old or encoded. */
  eg_request_t *req = malloc(sizeof *req);
  const char *g =
      "GET /simple/x/ HTTP/1.1\r\nAccept-Encoding: gzip\r\nIf-None-Match: \"e\"\r\nRange: "
      "bytes=0-1\r\nIf-Modified-Since: x\r\nIf-Range: y\r\nAccept: text/html\r\n\r\n";
  assert_int_equal(eg_http_parse_request(g, strlen(g), req), 1);
  cm_buf_t out;
  cm_buf_init(&out, 0);
  eg_http_forward_head(g, req, NULL, 0, "idx.test", "Basic dTpw", EG_FORWARD_PAGE, &out);
  assert_string_equal(out.data,
                      "GET /simple/x/ HTTP/1.1\r\nAccept: text/html\r\nHost: idx.test\r\n"
                      "Authorization: Basic dTpw\r\nConnection: close\r\n\r\n");
  cm_buf_release(&out);
  free(req);
}

/* ---------------------------------------------------------------- SOCKS5 and URLs */

static void test_socks5(void **state) {
  (void)state;
  size_t used = 0;
  assert_int_equal(eg_socks5_greeting((const uint8_t *)"\x05\x01\x00", 3, &used), 1);
  assert_int_equal(used, 3);
  assert_int_equal(eg_socks5_greeting((const uint8_t *)"\x05\x02\x02", 3, &used), 0);
  assert_int_equal(eg_socks5_greeting((const uint8_t *)"\x05\x01\x02", 3, &used), -1);
  assert_int_equal(eg_socks5_greeting((const uint8_t *)"\x04\x01", 2, &used), -1);
  char host[256];
  uint16_t port = 0;
  static const uint8_t v4[] = {5, 1, 0, 1, 198, 51, 100, 1, 0, 80};
  assert_int_equal(eg_socks5_request(v4, sizeof v4, &used, host, sizeof host, &port), 1);
  assert_string_equal(host, "198.51.100.1");
  assert_int_equal(port, 80);
  static const uint8_t dn[] = {5, 1, 0, 3, 8, 'P', 'y', 'p', 'i', '.', 'o', 'r', 'g', 1, 187};
  assert_int_equal(eg_socks5_request(dn, sizeof dn, &used, host, sizeof host, &port), 1);
  assert_string_equal(host, "pypi.org");
  assert_int_equal(port, 443);
  assert_int_equal(used, sizeof dn);
  assert_int_equal(eg_socks5_request(dn, sizeof dn - 1, &used, host, sizeof host, &port), 0);
  static const uint8_t bind[] = {5, 2, 0, 1, 1, 2, 3, 4, 0, 80};
  assert_int_equal(eg_socks5_request(bind, sizeof bind, &used, host, sizeof host, &port), -1);
  static const uint8_t badname[] = {5, 1, 0, 3, 3, 'a', ' ', 'b', 0, 80};
  assert_int_equal(eg_socks5_request(badname, sizeof badname, &used, host, sizeof host, &port), -1);
}

static void test_urls(void **state) {
  (void)state;
  eg_url_t u;
  const char *s = "https://us%40er:p%3Ass@Index.Example.com/simple/";
  assert_int_equal(eg_url_parse(s, strlen(s), &u), 0);
  assert_true(u.https);
  assert_string_equal(u.host, "index.example.com");
  assert_int_equal(u.port, 443);
  assert_false(u.explicit_port);
  assert_string_equal(u.user, "us@er");
  assert_string_equal(u.password, "p:ss");
  assert_string_equal(u.path, "/simple/");
  eg_url_release(&u);
  s = "http://127.0.0.1:3141?x=1";
  assert_int_equal(eg_url_parse(s, strlen(s), &u), 0);
  assert_int_equal(u.port, 3141);
  assert_true(u.explicit_port);
  assert_null(u.user);
  assert_string_equal(u.path, "/?x=1");
  eg_url_release(&u);
  s = "http://[::1]:8080/s";
  assert_int_equal(eg_url_parse(s, strlen(s), &u), 0);
  assert_string_equal(u.host, "::1");
  eg_url_release(&u);
  static const char *const bad[] = {"ftp://x/",        "http://",    "http://a b/",
                                    "http://x:99999/", "/local/dir", "http://x:/"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(bad); i++)
    if (eg_url_parse(bad[i], strlen(bad[i]), &u) == 0) fail_msg("accepted %s", bad[i]);
  char *r = eg_url_redact("https://user:secret@host/simple");
  assert_string_equal(r, "https://user@host/simple");
  free(r);
  r = eg_url_redact("https://host/simple");
  assert_string_equal(r, "https://host/simple");
  free(r);
  r = eg_url_redact("https://token@host/a@b");
  assert_string_equal(r, "https://token@host/a@b");
  free(r);
}

/* ---------------------------------------------------------------- secrets */

#define PH_A "mps-secret:A:0123456789abcdef0123456789abcdef"
#define PH_B "mps-secret:B:fedcba9876543210fedcba9876543210"

/* Rewrites head with A bound (value va) and B not; returns rc, the head in *out (heap). */
static int rewrite(const char *head, const char *va, bool a_bound, char **out, uint64_t *used,
                   size_t *refused) {
  eg_request_t req;
  if (eg_http_parse_request(head, strlen(head), &req) != 1)
    fail_msg("head did not parse: %s", head);
  eg_secret_binding_t b[2] = {{PH_A, strlen(PH_A), va, strlen(va), a_bound},
                              {PH_B, strlen(PH_B), "vb", 2, false}};
  cm_buf_t o;
  cm_buf_init(&o, 0);
  int rc = eg_secret_rewrite_head(head, &req, b, 2, &o, used, refused);
  *out = cm_buf_steal(&o);
  return rc;
}

static void test_secret_rewrite(void **state) {
  (void)state;
  char *out;
  uint64_t used;
  size_t refused;
  /* Nothing to do: untouched. */
  assert_int_equal(rewrite("GET / HTTP/1.1\r\nHost: h\r\n\r\n", "v", true, &out, &used, &refused),
                   0);
  assert_string_equal(out, "");
  free(out);
  /* A header value and the target, raw and percent-encoded (the value encoded there). */
  assert_int_equal(
      rewrite("GET /p?a=" PH_A "&b=mps-secret%3AA%3a0123456789abcdef0123456789abcdef "
              "HTTP/1.1\r\nAuthorization: Bearer " PH_A "\r\nX: a" PH_A "b" PH_A "\r\n\r\n",
              "t/k n", true, &out, &used, &refused),
      1);
  assert_string_equal(out,
                      "GET /p?a=t/k%20n&b=t%2Fk%20n HTTP/1.1\r\nAuthorization: Bearer t/k n\r\n"
                      "X: at/k nbt/k n\r\n\r\n");
  assert_int_equal(used, 1);
  free(out);
  /* Inside Basic credentials: decoded, replaced, encoded again (user:password = u:<ph>). */
  {
    /* base64("u:" PH_A) */
    cm_buf_t plain;
    cm_buf_init(&plain, 0);
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *src = "u:" PH_A;
    size_t n = strlen(src);
    for (size_t i = 0; i < n; i += 3) {
      unsigned v = (unsigned)(unsigned char)src[i] << 16;
      if (i + 1 < n) v |= (unsigned)(unsigned char)src[i + 1] << 8;
      if (i + 2 < n) v |= (unsigned char)src[i + 2];
      char q[4] = {tbl[(v >> 18) & 63], tbl[(v >> 12) & 63], i + 1 < n ? tbl[(v >> 6) & 63] : '=',
                   i + 2 < n ? tbl[v & 63] : '='};
      cm_buf_append(&plain, q, 4);
    }
    cm_buf_appends(&plain, "");
    cleanup_free char *head =
        xasprintf("GET / HTTP/1.1\r\nAuthorization: Basic %s\r\n\r\n", plain.data);
    cm_buf_release(&plain);
    assert_int_equal(rewrite(head, "secret", true, &out, &used, &refused), 1);
    assert_string_equal(out, "GET / HTTP/1.1\r\nAuthorization: Basic dTpzZWNyZXQ=\r\n\r\n");
    free(out);
    /* The same head where A is not bound: refused. */
    assert_int_equal(rewrite(head, "secret", false, &out, &used, &refused), -1);
    assert_int_equal(refused, 0);
    free(out);
  }
  /* Another secret's placeholder anywhere: refused, whatever else was bound. */
  assert_int_equal(
      rewrite("GET /?" PH_B " HTTP/1.1\r\nX: " PH_A "\r\n\r\n", "v", true, &out, &used, &refused),
      -1);
  assert_int_equal(refused, 1);
  free(out);
  assert_int_equal(rewrite("GET / HTTP/1.1\r\nX: mps-secret%3AB%3Afedcba9876543210fedcba9876543210"
                           "\r\nY: " PH_B "\r\n\r\n",
                           "v", true, &out, &used, &refused),
                   -1);
  assert_int_equal(refused, 1);
  free(out);
  /* Across a header's name and value (where nothing is substituted): refused, bound or not. */
  assert_int_equal(
      rewrite("GET / HTTP/1.1\r\nX-" PH_A ": v\r\n\r\n", "v", true, &out, &used, &refused), -1);
  assert_int_equal(refused, 0);
  free(out);
  assert_int_equal(
      rewrite("GET / HTTP/1.1\r\nX-" PH_B ": v\r\n\r\n", "v", true, &out, &used, &refused), -1);
  assert_int_equal(refused, 1);
  free(out);
  /* A value that would grow the head past EG_HEAD_MAX: refused. */
  {
    char *big = xmalloc(EG_SECRET_VALUE_MAX + 1);
    memset(big, 'x', EG_SECRET_VALUE_MAX);
    big[EG_SECRET_VALUE_MAX] = '\0';
    assert_int_equal(rewrite("GET / HTTP/1.1\r\nA: " PH_A "\r\nB: " PH_A "\r\nC: " PH_A "\r\n\r\n",
                             big, true, &out, &used, &refused),
                     -1);
    assert_int_equal(refused, 2);
    free(out);
    free(big);
  }
}

static void test_secret_names_and_placeholders(void **state) {
  (void)state;
  assert_true(eg_secret_name_ok("A", 1));
  assert_true(eg_secret_name_ok("GITHUB_TOKEN_2", 14));
  assert_false(eg_secret_name_ok("a", 1));
  assert_false(eg_secret_name_ok("_A", 2));
  assert_false(eg_secret_name_ok("A-B", 3));
  assert_false(eg_secret_name_ok("", 0));
  char long_name[66];
  memset(long_name, 'A', 65);
  long_name[65] = '\0';
  assert_true(eg_secret_name_ok(long_name, 64));
  assert_false(eg_secret_name_ok(long_name, 65));
  char p1[EG_SECRET_PLACEHOLDER_MAX], p2[EG_SECRET_PLACEHOLDER_MAX];
  eg_secret_placeholder(long_name, p1, sizeof p1);
  eg_secret_placeholder("TOK", p2, sizeof p2);
  assert_int_equal(strlen(p1), strlen("mps-secret::") + 64 + 32);
  assert_int_equal(strncmp(p2, "mps-secret:TOK:", 15), 0);
  char p3[EG_SECRET_PLACEHOLDER_MAX];
  eg_secret_placeholder("TOK", p3, sizeof p3);
  assert_string_not_equal(p2, p3);
  eg_secret_value_t v = {0};
  eg_secret_value_set(&v, "abc", 3);
  assert_int_equal(v.len, 3);
  assert_memory_equal(v.data, "abc", 3);
  eg_secret_value_set(&v, "de", 2);
  assert_string_equal(v.data, "de");
  eg_secret_value_wipe(&v);
  assert_null(v.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addr_parse),
      cmocka_unit_test(test_addr_classes),
      cmocka_unit_test(test_net_classes),
      cmocka_unit_test(test_addr_is_local),
      cmocka_unit_test(test_rule_parse),
      cmocka_unit_test(test_rule_match),
      cmocka_unit_test(test_policy_on),
      cmocka_unit_test(test_policy_closed_and_narrowed),
      cmocka_unit_test(test_policy_narrowing_ok),
      cmocka_unit_test(test_policy_wide_rules),
      cmocka_unit_test(test_policy_deny_resolved),
      cmocka_unit_test(test_http_request),
      cmocka_unit_test(test_http_forward),
      cmocka_unit_test(test_http_interim_heads),
      cmocka_unit_test(test_socks5),
      cmocka_unit_test(test_urls),
      cmocka_unit_test(test_index_path_below),
      cmocka_unit_test(test_links),
      cmocka_unit_test(test_page_scan),
      cmocka_unit_test(test_secret_rewrite),
      cmocka_unit_test(test_secret_names_and_placeholders),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
