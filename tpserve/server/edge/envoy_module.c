/* The HTTP filter hooks Envoy resolves in every dynamic module that none of the edge's modules needs
 * (scheduling, callouts, watermarks, per-route configuration), and base64 for the recorded bodies: defined once,
 * compiled into each. */
#include "envoy_module.h"

size_t module_base64(const uint8_t *in, size_t n, char *out) {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t length = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0u);
    out[length++] = alphabet[v >> 18 & 63];
    out[length++] = alphabet[v >> 12 & 63];
    out[length++] = i + 1 < n ? alphabet[v >> 6 & 63] : '=';
    out[length++] = i + 2 < n ? alphabet[v & 63] : '=';
  }
  return length;
}

void envoy_dynamic_module_on_http_filter_scheduled(void *f, void *m, uint64_t id) { (void)f, (void)m, (void)id; }
void envoy_dynamic_module_on_http_filter_config_scheduled(void *c, uint64_t id) { (void)c, (void)id; }
void envoy_dynamic_module_on_http_filter_http_callout_done(void *f, void *m, uint64_t id, int result, void *headers,
                                                           size_t nheaders, void *body, size_t nbody) {
  (void)f, (void)m, (void)id, (void)result, (void)headers, (void)nheaders, (void)body, (void)nbody;
}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void *f, void *m, uint64_t id, void *h, size_t n,
                                                             bool e) {
  (void)f, (void)m, (void)id, (void)h, (void)n, (void)e;
}
void envoy_dynamic_module_on_http_filter_http_stream_data(void *f, void *m, uint64_t id, const void *d, size_t n,
                                                          bool e) {
  (void)f, (void)m, (void)id, (void)d, (void)n, (void)e;
}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void *f, void *m, uint64_t id, void *t, size_t n) {
  (void)f, (void)m, (void)id, (void)t, (void)n;
}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void *f, void *m, uint64_t id) {
  (void)f, (void)m, (void)id;
}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void *f, void *m, uint64_t id, int reason) {
  (void)f, (void)m, (void)id, (void)reason;
}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void *f, void *m) {
  (void)f, (void)m;
}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void *f, void *m) {
  (void)f, (void)m;
}
void *envoy_dynamic_module_on_http_filter_per_route_config_new(dm_buffer name, dm_buffer text) {
  (void)name, (void)text;
  return NULL;
}
void envoy_dynamic_module_on_http_filter_per_route_config_destroy(void *c) { (void)c; }
