/* libFuzzer target for egress/rules.c.  Each line of the input is parsed as a rule and as an
 * address; a rule's canonical text parses again to the same rule (a fixed point); the first
 * lines form a policy (allow, deny, a narrowing) that every other line is judged against as
 * a destination name and an address.  Beyond memory safety: decisions are deterministic,
 * deny rules always win, and a narrowing never allows what the policy alone refuses. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm.h"
#include "egress/egress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_LINES 24

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data;
  eg_rule_t rules[MAX_LINES];
  bool ok[MAX_LINES];
  eg_addr_t addrs[MAX_LINES];
  bool is_addr[MAX_LINES];
  size_t n = 0, off = 0;
  while (off <= size && n < MAX_LINES) {
    const char *nl = memchr(buf + off, '\n', size - off);
    size_t len = nl ? (size_t)(nl - (buf + off)) : size - off;
    cm_error_t err = CM_ERROR_INIT;
    ok[n] = eg_rule_parse(buf + off, len, &rules[n], &err) == 0;
    if (ok[n] == (err.msg != NULL)) abort();
    if (!ok[n] && err.kind != CM_ERR_INVALID) abort();
    cm_error_release(&err);
    if (ok[n]) {
      eg_rule_t again;
      if (eg_rule_parse(rules[n].text, strlen(rules[n].text), &again, &err) != 0) abort();
      if (strcmp(again.text, rules[n].text) != 0 || again.kind != rules[n].kind ||
          again.port != rules[n].port)
        abort();
      if (rules[n].kind == EG_RULE_NET) {
        (void)eg_net_class(&rules[n].addr, rules[n].prefix);
        if (!eg_rule_match_addr(&rules[n], &rules[n].addr, rules[n].port ? rules[n].port : 1))
          abort();
      } else {
        const char *h = rules[n].kind == EG_RULE_HOST ? rules[n].host : NULL;
        if (h && !eg_rule_match_name(&rules[n], h, rules[n].port ? rules[n].port : 1)) abort();
      }
    }
    is_addr[n] = eg_addr_parse(buf + off, len, &addrs[n]) == 0;
    if (is_addr[n]) {
      char text[64];
      eg_addr_format(&addrs[n], text, sizeof text);
      eg_addr_t back;
      if (eg_addr_parse(text, strlen(text), &back) != 0 || !eg_addr_equal(&back, &addrs[n]))
        abort();
      (void)eg_addr_class(&addrs[n]);
    }
    n++;
    if (!nl) break;
    off += len + 1;
  }
  /* Policy: rules 0-3 allow, 4-5 deny, 6-7 narrow; on when the first byte is odd. */
  eg_policy_t p = {.public_internet = size > 0 && (data[0] & 1), .closed_reason = "closed"};
  eg_rule_t narrow[2];
  size_t n_narrow = 0;
  for (size_t i = 0; i < n && i < 8; i++) {
    if (!ok[i]) continue;
    if (i < 4)
      eg_policy_add_allow(&p, &rules[i]);
    else if (i < 6)
      eg_policy_add_deny(&p, &rules[i]);
    else
      narrow[n_narrow++] = rules[i];
  }
  for (size_t i = 0; i < n; i++) {
    char why[EG_REASON_MAX];
    if (ok[i]) {
      bool a = eg_policy_narrowing_ok(&p, &rules[i], why, sizeof why);
      if (a != eg_policy_narrowing_ok(&p, &rules[i], why, sizeof why)) abort();
    }
    if (!is_addr[i]) continue;
    uint16_t port = (uint16_t)(i * 1000 + 80);
    char host[64];
    eg_addr_format(&addrs[i], host, sizeof host);
    bool base = eg_policy_allows(&p, NULL, 0, host, &addrs[i], port, &addrs[0], 1, why, sizeof why);
    bool nar = eg_policy_allows(&p, n_narrow ? narrow : NULL, n_narrow, host, &addrs[i], port,
                                &addrs[0], 1, why, sizeof why);
    if (nar && !base) abort();
    if (!base && why[0] == '\0') abort();
    for (size_t d = 0; d < p.n_deny; d++)
      if (eg_rule_match_addr(&p.deny[d], &addrs[i], port) && base) abort();
    (void)eg_policy_precheck(&p, NULL, 0, host, port, why, sizeof why);
  }
  eg_policy_release(&p);
  return 0;
}
