/* What the edge's Envoy dynamic modules (cancel_notice.c, record_grpc.c, checks_module.c) share: the ABI's types and constants as
 * Envoy 1.40 defines them (ABI v0.2: source/extensions/dynamic_modules/abi/abi.h of Envoy), the callbacks
 * they call, and base64 (the recorded bodies). The hooks none needs are defined once, in envoy_module.c, compiled
 * into each module, with base64. */
#ifndef TPSERVE_ENVOY_MODULE_H
#define TPSERVE_ENVOY_MODULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *ptr;
  size_t length;
} dm_buffer; /* envoy_dynamic_module_type_envoy_buffer and _module_buffer: the same layout */

typedef struct {
  const char *key;
  size_t key_length;
  const char *value;
  size_t value_length;
} dm_header; /* envoy_dynamic_module_type_module_http_header */

enum { HEADER_REQUEST = 0, HEADER_RESPONSE = 2, TRAILER_RESPONSE = 3 }; /* ..._http_header_type_* */
enum { CONTINUE = 0, STOP = 1 }; /* every on_http_filter_*_status: Continue; request headers: StopIteration */

#define ABI_VERSION "v0.2.0"

enum { BODY_RECEIVED_REQUEST = 0 }; /* envoy_dynamic_module_type_http_body_type_ReceivedRequestBody */
extern size_t envoy_dynamic_module_callback_http_get_body_chunks_size(void *filter, int body_type);
extern bool envoy_dynamic_module_callback_http_get_body_chunks(void *filter, int body_type, dm_buffer *chunks);

/* Base64 (RFC 4648, padded) of in[0..n) into out, which holds BASE64_LENGTH(n) bytes; the length written. Callers
 * encode in blocks (BASE64_BLOCK bytes into a buffer of BASE64_LENGTH(BASE64_BLOCK)): no size is multiplied. */
#define BASE64_LENGTH(n) (((n) + 2) / 3 * 4)
#define BASE64_BLOCK 768
size_t module_base64(const uint8_t *in, size_t n, char *out);

extern bool envoy_dynamic_module_callback_http_get_header(void *filter, int header_type, dm_buffer key,
                                                          dm_buffer *result, size_t index, size_t *count);

#endif
