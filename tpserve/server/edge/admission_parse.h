/* Which model a request is for, read from the client's bytes as the edge's admission check needs it
 * (server/edge/cancel_notice.c): from an HTTP inference path, or from the start of a gRPC ModelInfer message.
 * Both read only the bytes given and never past them; a name is returned as a pointer into those bytes and its
 * length, at most ADMISSION_NAME_MAX. Anything else (another path, a message whose model_name is not within the
 * bytes given) is "not known": the check then admits the request (admission sheds load; it is not a security
 * check: the edge's other checks and bounds hold either way). Fuzzed under ASan/UBSan: tests/native/fuzz_admission.c. */
#ifndef TPSERVE_ADMISSION_PARSE_H
#define TPSERVE_ADMISSION_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { ADMISSION_NAME_MAX = 256 };

/* /v2/models/<name>/infer or /v2/models/<name>/versions/<v>/infer (a query after either): the name. */
static inline bool admission_model_from_path(const char *path, size_t length, const char **name, size_t *name_length) {
  static const char prefix[] = "/v2/models/";
  const size_t p = sizeof prefix - 1;
  if (length <= p || memcmp(path, prefix, p) != 0) return false;
  size_t end = p;
  while (end < length && path[end] != '/' && path[end] != '?') end++;
  if (end == p || end - p > ADMISSION_NAME_MAX || end == length || path[end] != '/') return false;
  size_t rest = end, stop = length;
  for (size_t i = end; i < length; i++)
    if (path[i] == '?') {
      stop = i;
      break;
    }
  static const char infer[] = "/infer", versions[] = "/versions/";
  bool plain = stop - rest == sizeof infer - 1 && memcmp(path + rest, infer, sizeof infer - 1) == 0;
  bool versioned = false;
  if (!plain && stop - rest > sizeof versions - 1 + sizeof infer - 1 &&
      memcmp(path + rest, versions, sizeof versions - 1) == 0) {
    size_t v = rest + sizeof versions - 1, v_end = v;
    while (v_end < stop && path[v_end] != '/') v_end++;
    versioned = v_end > v && stop - v_end == sizeof infer - 1 && memcmp(path + v_end, infer, sizeof infer - 1) == 0;
  }
  if (!plain && !versioned) return false;
  *name = path + p, *name_length = end - p;
  return true;
}

/* A protobuf varint at *at (within length): false where it runs past the bytes or past 10 bytes. */
static inline bool admission_varint(const uint8_t *bytes, size_t length, size_t *at, uint64_t *value) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 70; shift += 7) {
    if (*at >= length) return false;
    uint8_t b = bytes[(*at)++];
    if (shift == 63 && b > 1) return false;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *value = v;
      return true;
    }
  }
  return false;
}

/* The first gRPC message of a ModelInfer / ModelStreamInfer call (5-byte prefix: flag, big-endian length), as far as
 * the bytes go: its model_name (field 1). A compressed message or one whose field 1 is not within the bytes: false. */
static inline bool admission_model_from_grpc(const uint8_t *bytes, size_t length, const char **name,
                                             size_t *name_length) {
  if (length < 5 || bytes[0] != 0) return false;
  uint64_t message = (uint64_t)bytes[1] << 24 | (uint64_t)bytes[2] << 16 | (uint64_t)bytes[3] << 8 | bytes[4];
  size_t end = message < length - 5 ? (size_t)message + 5 : length; /* the message's bytes that are here */
  size_t at = 5;
  while (at < end) {
    uint64_t tag = 0, size = 0;
    if (!admission_varint(bytes, end, &at, &tag)) return false;
    uint64_t field = tag >> 3, wire = tag & 7;
    if (wire == 0) {
      if (!admission_varint(bytes, end, &at, &size)) return false;
    } else if (wire == 1 || wire == 5) {
      size_t skip = wire == 1 ? 8 : 4;
      if (end - at < skip) return false;
      at += skip;
    } else if (wire == 2) {
      if (!admission_varint(bytes, end, &at, &size) || size > end - at) return false;
      if (field == 1) {
        if (size == 0 || size > ADMISSION_NAME_MAX) return false;
        *name = (const char *)bytes + at, *name_length = (size_t)size;
        return true;
      }
      at += (size_t)size;
    } else {
      return false;
    }
  }
  return false;
}

/* FNV-1a, 64 bits: how the admission table names a model (0 is kept for an empty slot: it becomes 1). */
static inline uint64_t admission_hash(const char *name, size_t length) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < length; i++) h = (h ^ (uint8_t)name[i]) * 1099511628211ull;
  return h ? h : 1;
}

#endif
