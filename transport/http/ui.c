/* The playground page (issue 23): GET <path>/ui and its assets, and GET <path> when a browser
 * navigates to it (Accept: text/html first).  The page, its script and its style sheet are
 * built into the binary (ui-assets.c, generated from ui/src/ by ui/embed.cmake); the optional
 * editor bundle (ui/build.sh: CodeMirror, from npm) is read from beside the binary, so a build
 * without npm still serves a working page (a plain textarea, which the page says).
 *
 * No token is needed for these files: they are the same for everyone and hold nothing of the
 * server's; the page asks for the token and sends it on its own MCP requests (routes.c checks
 * those as any client's).  The Origin and Host checks apply as to the endpoint (a page on a
 * rebound name must not get it), and the Content-Security-Policy keeps every request of the
 * page on this origin. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/http/http-internal.h"

/* Generated (ui/embed.cmake). */
extern const unsigned char tr_ui_index_html[], tr_ui_app_js[], tr_ui_app_css[];
extern const size_t tr_ui_index_html_len, tr_ui_app_js_len, tr_ui_app_css_len;

/* Scripts only from this origin (no inline script, no eval); requests only to it; images
 * also as data: (a run's plots) and blob: URLs; styles also inline, since the editor sets
 * element styles and adds its own sheet at run time (no script can come of a style). */
#define UI_CSP                                                                          \
  "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src "   \
  "'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-" \
  "ancestors 'none'"

/* The editor bundle's size is ours (ui/build.sh), but a file beside the binary is read whole
 * per request only below this. */
#define UI_MAX_BUNDLE (8u << 20)

static void ui_headers(struct MHD_Response *r, const char *type) {
  tr_mhd.add_response_header(r, "Content-Type", type);
  tr_mhd.add_response_header(r, "Cache-Control", "no-cache");
  tr_mhd.add_response_header(r, "X-Content-Type-Options", "nosniff");
  tr_mhd.add_response_header(r, "Referrer-Policy", "no-referrer");
  tr_mhd.add_response_header(r, "Content-Security-Policy", UI_CSP);
  tr_mhd.add_response_header(r, "X-Frame-Options", "DENY");
}

static enum MHD_Result ui_static(hs_conn_t *c, const unsigned char *data, size_t len,
                                 const char *type) {
  struct MHD_Response *r =
      tr_mhd.create_response_from_buffer(len, (void *)(uintptr_t)data, MHD_RESPMEM_PERSISTENT);
  if (!r) return MHD_NO;
  ui_headers(r, type);
  return tr_hs_queue(c, 200, r);
}

/* The page names its base (the endpoint) so that its script finds the endpoint wherever
 * --http-path puts it: "@BASE@" in index.html becomes the path (which config made of
 * [A-Za-z0-9/._~-] only; escaped anyway). */
static enum MHD_Result ui_page(hs_conn_t *c) {
  const char *tmpl = (const char *)tr_ui_index_html;
  size_t n = tr_ui_index_html_len;
  cm_buf_t b;
  cm_buf_init(&b, n + 256);
  cleanup_free char *base = NULL;
  {
    cm_buf_t e;
    cm_buf_init(&e, 0);
    for (const char *p = c->h->path; *p; p++) {
      if (*p == '&' || *p == '<' || *p == '>' || *p == '"' || *p == '\'')
        cm_buf_printf(&e, "&#%d;", *p);
      else
        cm_buf_append(&e, p, 1);
    }
    base = cm_buf_steal(&e);
  }
  /* "@PREFIX@": what is under the endpoint is under its path without a trailing slash (under
   * "/", "//ui/app.js" would name a host "ui"); routes.c matches the same. */
  size_t plen = strlen(base);
  while (plen && base[plen - 1] == '/') plen--;
  for (size_t i = 0; i < n;) {
    if (i + 6 <= n && memcmp(tmpl + i, "@BASE@", 6) == 0) {
      cm_buf_appends(&b, base);
      i += 6;
    } else if (i + 8 <= n && memcmp(tmpl + i, "@PREFIX@", 8) == 0) {
      cm_buf_append(&b, base, plen);
      i += 8;
    } else {
      cm_buf_append(&b, tmpl + i, 1);
      i++;
    }
  }
  size_t len = b.len;
  char *body = cm_buf_steal(&b);
  struct MHD_Response *r = tr_mhd.create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  ui_headers(r, "text/html; charset=utf-8");
  return tr_hs_queue(c, 200, r);
}

/* The editor bundle: installed (<bindir>/MPS_REL_DATADIR/ui/editor.js) or a build
 * directory's (<bindir>/mps-ui/editor.js). */
static int ui_open_bundle(uint64_t *size) {
  cleanup_free char *self = realpath("/proc/self/exe", NULL);
  char *slash = self ? strrchr(self, '/') : NULL;
  if (!slash) return -1;
  *slash = '\0';
  const char *candidates[] = {"/" MPS_REL_DATADIR "/ui/editor.js", "/mps-ui/editor.js"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(candidates); i++) {
    cleanup_free char *p = xasprintf("%s%s", self, candidates[i]);
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= UI_MAX_BUNDLE) {
      *size = (uint64_t)st.st_size;
      return fd;
    }
    close(fd);
  }
  return -1;
}

static enum MHD_Result ui_bundle(hs_conn_t *c) {
  uint64_t size = 0;
  int fd = ui_open_bundle(&size);
  if (fd < 0) /* The page falls back to a textarea: a 404 it expects, not an error. */
    return tr_hs_respond_error(c, 404, -32000, "Not Found: this build has no editor bundle", NULL,
                               NULL);
  struct MHD_Response *r = tr_mhd.create_response_from_fd64(size, fd);
  if (!r) {
    close(fd);
    return MHD_NO;
  }
  ui_headers(r, "text/javascript; charset=utf-8");
  return tr_hs_queue(c, 200, r);
}

enum MHD_Result tr_hs_serve_ui(hs_conn_t *c, const char *rest) {
  if (!*rest || strcmp(rest, "/") == 0) return ui_page(c);
  if (strcmp(rest, "/app.js") == 0)
    return ui_static(c, tr_ui_app_js, tr_ui_app_js_len, "text/javascript; charset=utf-8");
  if (strcmp(rest, "/app.css") == 0)
    return ui_static(c, tr_ui_app_css, tr_ui_app_css_len, "text/css; charset=utf-8");
  if (strcmp(rest, "/editor.js") == 0) return ui_bundle(c);
  return tr_hs_respond_error(c, 404, -32000, "Not Found", NULL, NULL);
}

bool tr_hs_wants_page(hs_conn_t *c) {
  /* A browser's navigation puts text/html first; a client of the endpoint never does. */
  const char *a = tr_hs_header(c, "Accept");
  if (!a) return false;
  size_t n = strcspn(a, ",");
  return tr_http_media_type_is(a, n, "text/html");
}
