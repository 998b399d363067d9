/* Writes the server's seccomp BPF program (sbx_seccomp_fd, sandbox/seccomp.c) to stdout, so
 * bench/tools/ablate_bwrap.py can give bwrap the same filter outside the server.
 * Built by bench/run.sh --profile against the release build's static libraries. */
#include <stdio.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"

int main(void) {
  cm_error_t err = CM_ERROR_INIT;
  int fd = sbx_seccomp_fd(&err);
  if (fd < 0) {
    fprintf(stderr, "sbx_seccomp_fd: %s\n", cm_error_message(&err));
    return 1;
  }
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) (void)!write(1, buf, (size_t)n);
  return 0;
}
