/* The guard's frame rewriting (server/triton/front/, linked in; its libc wrappers renamed g_* at compile time)
 * against a model of what it must do, under AddressSanitizer and UBSan. Each step the peer sends whole HTTP/2
 * frames, split at random points, and the program reads them through the guard with random buffer sizes and
 * calls (recv, recvmsg over several buffers, read, readv; rooms of 1 byte up); the server's own writes end streams
 * between steps. What each step's reads return must be exactly the model's rewriting of what was sent: every
 * RST_STREAM of 4 bytes an empty DATA ending the stream where it is open on both sides, else a WINDOW_UPDATE of 1.
 *
 * Between connections, a public one (TRITON_GUARD_H2_PUBLIC): valid and broken client frames (header blocks whole and
 * split, deadlines, blocks gRPC's decoder would fail on, DATA, control frames, random bytes) in random pieces, read
 * with random calls and rooms while the server writes its settings and ends streams, under a waiting bound of 1 to 3
 * calls a third of the time (new calls past it refused, the refusals written to the client), with ModelStreamInfer
 * served half the time (else each stream refused at its first DATA, or the connection cut); then the client hangs
 * up. No read may fail, and the connection must end for the server once it has ended every stream. With a
 * cancelled-calls table (2d), what the reads hand out must still be whole frames in order, every header block of
 * CONTINUATIONs of its own stream only, each ModelInfer call's block ended by its id's frame; the ids of the calls
 * the client left are in the table. A read that comes with the socket's own control message (gRPC reads TCP_INQ
 * from it, and waits for an edge when it says nothing is queued) leaves nothing for the next read while the socket
 * is quiet: bytes kept back then (an id frame past the caller's room) would wait for a client byte that may never
 * come.
 *
 *   fuzz_guard SECONDS SEED   (exit 0: every step matched, every public connection ended) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "../../tpserve/server/triton/front/bounds.h"
#include "../../tpserve/server/triton/front/call_ids.h"
#include "../../tpserve/server/triton/front/h2_admission.h"
#include "../../tpserve/server/triton/front/h2_own_frames.h"
#include "../../tpserve/server/triton/front/h2_streams.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

typedef struct {
  uint8_t* bytes;
  size_t length, room;
} buffer;

static void put(buffer* b, const void* bytes, size_t n) {
  if (b->length + n > b->room) {
    b->room = (b->length + n) * 2;
    b->bytes = realloc(b->bytes, b->room);
  }
  memcpy(b->bytes + b->length, bytes, n);
  b->length += n;
}

static void frame(buffer* b, uint8_t type, uint8_t flags, uint32_t stream, const uint8_t* payload, uint32_t n) {
  uint8_t head[9] = {(uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n, type, flags,
                     (uint8_t)(stream >> 24), (uint8_t)(stream >> 16), (uint8_t)(stream >> 8), (uint8_t)stream};
  put(b, head, 9);
  put(b, payload, n);
}

/* The model: streams open on both sides. */
static uint32_t open_set[4096];
static size_t open_n;
static int model_open(uint32_t s) {
  for (size_t i = 0; i < open_n; ++i) {
    if (open_set[i] == s) return 1;
  }
  return 0;
}
static void model_close(uint32_t s) {
  for (size_t i = 0; i < open_n; ++i) {
    if (open_set[i] == s) open_set[i] = open_set[--open_n];
  }
}

static uint32_t next_stream = 1;

/* One peer frame into sent, and what the guard must hand out for it into expected. */
static void peer_frame(buffer* sent, buffer* expected) {
  uint8_t payload[64];
  uint32_t n = (uint32_t)below(40);
  for (uint32_t k = 0; k < n; ++k) payload[k] = (uint8_t)next();
  size_t kind = below(10);
  uint32_t stream = open_n && below(3) ? open_set[below(open_n)] : 1 + 2 * (uint32_t)below(next_stream);
  if (kind <= 2 && open_n < 4000) { /* HEADERS opening a stream, sometimes ending it at once */
    stream = next_stream * 2 + 1, next_stream++;
    uint8_t flags = below(3) == 0 ? 0x5 : 0x4;
    frame(sent, 1, flags, stream, payload, n), frame(expected, 1, flags, stream, payload, n);
    if (!(flags & 1)) open_set[open_n++] = stream;
  } else if (kind <= 4) { /* DATA, sometimes with a RST_STREAM's bytes inside, sometimes half-closing */
    if (n >= 13 && below(2)) memcpy(payload, "\x00\x00\x04\x03\x00\x00\x00\x00\x01", 9);
    uint8_t flags = below(3) == 0 ? 1 : 0;
    frame(sent, 0, flags, stream, payload, n), frame(expected, 0, flags, stream, payload, n);
    if (flags) model_close(stream);
  } else if (kind <= 7) { /* RST_STREAM */
    uint8_t code[4] = {0, 0, 0, 8};
    frame(sent, 3, 0, stream, code, 4);
    if (model_open(stream)) {
      frame(expected, 0, 0x9, stream, (const uint8_t*)"\x03\x00\x00\x00", 4);
      model_close(stream);
    } else {
      frame(expected, 8, 0, stream, (const uint8_t*)"\x00\x00\x00\x01", 4);
    }
  } else { /* SETTINGS, PING, WINDOW_UPDATE, a RST_STREAM of another length: passed as they are */
    uint8_t type = (uint8_t[]){4, 6, 8, 3}[below(4)];
    uint32_t length = type == 3 ? 5 : n;
    frame(sent, type, 0, type == 4 || type == 6 ? 0 : stream, payload, length);
    frame(expected, type, 0, type == 4 || type == 6 ? 0 : stream, payload, length);
  }
}

/* The server ends a stream (its trailers, or its own RST_STREAM) through the guard's write wrappers. */
static void server_ends(int fd, int drain) {
  if (!open_n) return;
  uint32_t stream = open_set[below(open_n)];
  buffer out = {0};
  if (below(2)) frame(&out, 1, 0x5, stream, (const uint8_t*)"\x88", 1);
  else frame(&out, 3, 0, stream, (const uint8_t*)"\x00\x00\x00\x00", 4);
  size_t cut = below(out.length);
  struct iovec parts[2] = {{out.bytes, cut}, {out.bytes + cut, out.length - cut}};
  struct msghdr message = {0};
  message.msg_iov = parts, message.msg_iovlen = 2;
  if (below(2)) g_sendmsg(fd, &message, 0);
  else g_write(fd, out.bytes, cut), g_writev(fd, parts + 1, 1);
  model_close(stream);
  uint8_t sink[256];
  while (recv(drain, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
  free(out.bytes);
}

static size_t last_control; /* the control bytes the last read through the guard came with */

/* Reads through the guard with a random call and room; -1 with EAGAIN when nothing whole is there yet. */
static ssize_t guarded(int fd, uint8_t* into, size_t room) {
  size_t cut = below(room + 1);
  struct iovec parts[2] = {{into, cut}, {into + cut, room - cut}};
  struct msghdr message = {0};
  char control[CMSG_SPACE(sizeof(struct ucred))]; /* SO_PASSCRED: the socket's own reads bring one */
  message.msg_iov = parts, message.msg_iovlen = 2;
  message.msg_control = control, message.msg_controllen = sizeof control;
  last_control = 0;
  switch (below(4)) {
    case 0: return g_recv(fd, into, room, 0);
    case 1: {
      ssize_t n = g_recvmsg(fd, &message, 0);
      last_control = n > 0 ? message.msg_controllen : 0;
      return n;
    }
    case 2: return g_read(fd, into, room);
    default: return g_readv(fd, parts, 2);
  }
}

static int step(int peer, int server) {
  buffer sent = {0}, expected = {0}, got = {0};
  size_t frames = 1 + below(6);
  for (size_t k = 0; k < frames; ++k) peer_frame(&sent, &expected);
  size_t at = 0;
  uint8_t into[4096];
  int broken = 0;
  while (!broken && got.length < expected.length) {
    if (at < sent.length) { /* a random piece of what the peer sends */
      size_t piece = 1 + below(sent.length - at);
      if (sendto(peer, sent.bytes + at, piece, 0, NULL, 0) != (ssize_t)piece) broken = 1;
      at += piece;
    }
    for (;;) {
      size_t room = below(4) == 0 ? 1 + below(12) : 1 + below(sizeof into);
      ssize_t n = guarded(server, into, room);
      if (n < 0 && errno != EAGAIN) { /* a reader is never failed: gRPC would drop the connection */
        fprintf(stderr, "fuzz_guard: a read of room %zu failed: %s\n", room, strerror(errno));
        broken = 1;
        break;
      }
      if (n <= 0) break;
      put(&got, into, (size_t)n);
    }
    if (!broken && at == sent.length && got.length < expected.length) {
      ssize_t n = guarded(server, into, sizeof into); /* all sent: what is left must come out now */
      if (n <= 0) break;
      put(&got, into, (size_t)n);
    }
  }
  int same = !broken && got.length == expected.length && memcmp(got.bytes, expected.bytes, got.length) == 0;
  if (!same) fprintf(stderr, "fuzz_guard: a step read %zu bytes, expected %zu (or other bytes)\n", got.length,
                     expected.length);
  free(sent.bytes), free(expected.bytes), free(got.bytes);
  return same;
}

/* a ModelInfer call's header block (its :path, a literal of the static name) */
static const uint8_t infer_block[] = "\x04\x2a/inference.GRPCInferenceService/ModelInfer";

/* ---- a public port (TRITON_GUARD_H2_PUBLIC): a client's frames, valid and broken, whatever the reads ---- */

/* One client frame for a public port: mostly valid (header blocks, DATA within the windows, control frames,
 * CONTINUATIONs, resets, deadlines), sometimes broken (a bad size, stream, block, or random bytes). */
static void public_frame(buffer* sent, uint32_t* streams, size_t* count) {
  static const uint8_t blocks[][24] = {
      {0x82, 0x86, 0x84},                                                  /* indexed */
      {0x40, 0x0c, 'g', 'r', 'p', 'c', '-', 't', 'i', 'm', 'e', 'o', 'u', 't', 0x02, '1', 'S'}, /* a deadline */
      {0x40, 0x89, 0x9a, 0xca, 0xc8, 0xb2, 0x4d, 0x49, 0x4f, 0x6a, 0x7f, 0x02, '9', 'm'},       /* coded */
      {0xbe},                                                              /* an index past the tables */
      {0x3f, 0xe9, 0x26},                                                  /* a table size too large */
  };
  static const size_t block_length[] = {3, 17, 14, 1, 3};
  uint8_t payload[64];
  for (size_t k = 0; k < sizeof payload; ++k) payload[k] = (uint8_t)next();
  uint32_t stream = *count && below(3) ? streams[below(*count)] : 2 * (uint32_t)below(64) + 1;
  static const uint8_t stream_block[] = "\x04\x30/inference.GRPCInferenceService/ModelStreamInfer";
  switch (below(13)) {
    case 12: { /* a ModelStreamInfer stream (its DATA read whole, its messages checked) or a ModelInfer call, and a
                * message or a bad one */
      stream = *count ? streams[*count - 1] + 2 : 1;
      if (below(2)) frame(sent, 1, 0x4, stream, stream_block, sizeof stream_block - 1);
      else frame(sent, 1, 0x4, stream, infer_block, sizeof infer_block - 1); /* refused past a waiting bound */
      if (*count < 4000) streams[(*count)++] = stream;
      static const uint8_t good[] = "\0\0\0\0\x0d\x0a\x04" "acme\x2a\x05\x0a\x01x\x1a\x00";
      const uint8_t *message = below(3) ? good : payload;
      size_t n = message == good ? sizeof good - 1 : below(40), cut = below(n + 1);
      frame(sent, 0, 0, stream, message, (uint32_t)cut);
      frame(sent, 0, below(2), stream, message + cut, (uint32_t)(n - cut));
      break;
    }
    case 0: case 1: case 2: { /* a header block, in one frame or split into CONTINUATIONs */
      size_t b = below(8) == 0 ? 3 + below(2) : below(3), n = block_length[b];
      stream = *count ? streams[*count - 1] + 2 : 1;
      uint8_t flags = below(2) ? 0x1 : 0x0;
      if (below(3) == 0 && n > 1) {
        size_t cut = 1 + below(n - 1);
        frame(sent, 1, flags, stream, blocks[b], (uint32_t)cut);
        frame(sent, 9, 0x4, stream, blocks[b] + cut, (uint32_t)(n - cut));
      } else {
        frame(sent, 1, flags | 0x4, stream, blocks[b], (uint32_t)n);
      }
      if (*count < 4000) streams[(*count)++] = stream;
      break;
    }
    case 3: case 4: frame(sent, 0, below(3) == 0 ? 0x1 : 0, stream, payload, (uint32_t)below(40)); break;
    case 5: frame(sent, 8, 0, below(2) ? 0 : stream, (const uint8_t*)"\x00\x00\x10\x00", 4); break;
    case 6: frame(sent, 4, 0, 0, (const uint8_t*)"\x00\x04\x00\x01\x00\x00", 6); break;
    case 7: frame(sent, 6, 0, 0, payload, 8); break;
    case 8: frame(sent, 3, 0, stream, (const uint8_t*)"\x00\x00\x00\x08", 4); break;
    case 9: frame(sent, 7, 0, 0, payload, 8 + (uint32_t)below(8)); break;
    case 10: frame(sent, (uint8_t)below(12), (uint8_t)next(), (uint32_t)below(8), payload, (uint32_t)below(40)); break;
    default: put(sent, payload, below(20)); /* random bytes */
  }
}

static uint64_t *table; /* the cancelled-calls table, as the models map it */
static long ids_seen, ids_marked;

/* What gRPC read of a public connection: the preface, then whole frames (the last may be cut by the end), no frame
 * but a CONTINUATION of its stream inside a header block; counts the id frames (2d) and those the table holds. */
static int well_framed(const uint8_t* b, size_t n) {
  uint32_t in_block = 0;
  int id_due = 0; /* the frame before was a ModelInfer call's HEADERS: its id's frame must follow */
  for (size_t at = 24; at + 9 <= n;) {
    uint32_t length = (uint32_t)b[at] << 16 | (uint32_t)b[at + 1] << 8 | b[at + 2];
    uint8_t type = b[at + 3], flags = b[at + 4];
    uint32_t stream = ((uint32_t)(b[at + 5] & 0x7f) << 24) | (uint32_t)b[at + 6] << 16 | (uint32_t)b[at + 7] << 8 | b[at + 8];
    if (at + 9 + length > n) break;
    if (in_block && (type != 9 || stream != in_block)) return 0;
    if (!in_block && type == 9) return 0;
    int is_id = type == 9 && length == 30 && memcmp(b + at + 11, "x-edge-call", 11) == 0;
    if (id_due && !is_id) return 0;
    id_due = type == 1 && length == sizeof infer_block - 1 && memcmp(b + at + 9, infer_block, length) == 0;
    if (type == 1 || type == 9) in_block = flags & 0x4 ? 0 : stream;
    if (is_id) {
      char hex[17] = {0};
      memcpy(hex, b + at + 23, 16);
      uint64_t id = strtoull(hex, NULL, 16);
      ids_seen++;
      if (table[id % (1u << 18)] == id) ids_marked++;
    }
    at += 9 + length;
  }
  return 1;
}

/* A public connection: frames sent in random pieces, read with random calls and rooms, the server answering and
 * ending streams through the write wrappers; then the client hangs up. No read may fail, and once the server has
 * ended every stream the connection must end for it (a read returns 0) within a bounded number of reads. */
static int public_connection(void) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 0;
  fcntl(pair[1], F_SETFL, O_NONBLOCK);
  int one = 1;
  setsockopt(pair[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
  h2_watch(pair[1], 1);
  waiting_bound = below(3) == 0 ? 1 + (long)below(3) : 0; /* calls past it refused (2c): their answers written too */
  streaming_served = below(2) == 0; /* off: each ModelStreamInfer stream refused at its first message, or cut */
  buffer sent = {0};
  put(&sent, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  frame(&sent, 4, 0, 0, (const uint8_t*)"", 0);
  static uint32_t streams[4096];
  size_t count = 0, frames = 1 + below(40);
  for (size_t k = 0; k < frames; ++k) public_frame(&sent, streams, &count);
  buffer settings = {0};
  frame(&settings, 4, 0, 0, (const uint8_t*)"\x00\x04\x00\x40\x00\x00\x00\x05\x00\x40\x00\x00", 12);
  frame(&settings, 8, 0, 0, (const uint8_t*)"\x00\x3f\x00\x01", 4);
  g_write(pair[1], settings.bytes, settings.length);
  uint8_t into[4096], sink[4096];
  buffer read_out = {0};
  int failed = 0;
  for (size_t at = 0; at < sent.length && !failed;) {
    size_t piece = 1 + below(sent.length - at);
    if (send(pair[0], sent.bytes + at, piece, MSG_DONTWAIT) <= 0) break; /* the guard stopped reading: enough */
    at += piece;
    for (int r = 0; r < 8; ++r) {
      ssize_t n = guarded(pair[1], into, below(4) == 0 ? 1 + below(12) : 1 + below(sizeof into));
      if (n < 0 && errno != EAGAIN) failed = 1;
      if (n <= 0) break;
      put(&read_out, into, (size_t)n);
      uint8_t peek;
      if (last_control > 0 && recv(pair[1], &peek, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) {
        ssize_t kept = guarded(pair[1], into, sizeof into); /* the socket is quiet: nothing may be left */
        if (kept > 0) {
          fprintf(stderr, "fuzz_guard: %zd bytes were kept back from a read whose control message said the "
                          "socket had nothing more\n", kept);
          failed = 1;
        }
      }
    }
    while (recv(pair[0], sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
  }
  if (below(2)) shutdown(pair[0], SHUT_WR); /* a hang-up: FIN, or the socket closed */
  else close(pair[0]), pair[0] = -1;
  int ended = 0;
  for (int r = 0; r < 10000 && !failed && !ended; ++r) {
    if (r % 50 == 49) { /* the server ends every stream it may run (random frames may have opened ids below 128) */
      buffer out = {0};
      for (size_t k = 0; k < count; ++k) frame(&out, 1, 0x5, streams[k], (const uint8_t*)"\x88", 1);
      for (uint32_t id = 1; id < 130; id += 2) frame(&out, 3, 0, id, (const uint8_t*)"\x00\x00\x00\x08", 4);
      g_write(pair[1], out.bytes, out.length);
      free(out.bytes);
    }
    ssize_t n = guarded(pair[1], into, 1 + below(sizeof into));
    if (n < 0 && errno != EAGAIN && errno != ECONNRESET && errno != EPIPE) failed = 1;
    if (n == 0) ended = 1;
    if (n > 0) put(&read_out, into, (size_t)n);
    if (pair[0] >= 0) {
      while (recv(pair[0], sink, sizeof sink, MSG_DONTWAIT) > 0) {
      }
    }
  }
  if (!ended && !failed) {
    struct h2_reader* reader = readers[pair[1]];
    fprintf(stderr, "fuzz_guard: a public connection never ended for the server (gone %d, synth %zu); its streams:",
            reader ? reader->gone : -1, reader ? reader->synth_count : 0);
    for (uint32_t i = 0; reader && i < reader->stream_room; i++) {
      if (reader->streams[i].stream) fprintf(stderr, " %u:%u", reader->streams[i].stream, reader->streams[i].state);
    }
    fprintf(stderr, "\n");
  }
  if (failed) fprintf(stderr, "fuzz_guard: a read on a public connection failed: %s\n", strerror(errno));
  if (!failed && !well_framed(read_out.bytes, read_out.length)) {
    fprintf(stderr, "fuzz_guard: what gRPC read of a public connection is not whole frames, blocks whole\n");
    failed = 1;
  }
  free(read_out.bytes);
  g_close(pair[1]);
  if (pair[0] >= 0) close(pair[0]);
  free(sent.bytes), free(settings.bytes);
  return ended && !failed;
}

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN); /* the server writes to clients that hung up, as gRPC does (MSG_NOSIGNAL) */
  char calls[] = "/tmp/fuzz_guard_callsXXXXXX";
  int table_fd = mkstemp(calls); /* 0600 */
  if (table_fd < 0 || ftruncate(table_fd, (off_t)8 << 18) != 0) return 2;
  table = mmap(NULL, (size_t)8 << 18, PROT_READ, MAP_SHARED, table_fd, 0);
  close(table_fd);
  if (table == MAP_FAILED) return 2;
  setenv("TRITON_CANCELLED_CALLS", calls, 1);
  call_ids_start();
  unlink(calls);
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  state ^= argc > 2 ? strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull : 0;
  if (state == 0) state = 1;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long steps = 0, connections = 0, publics = 0;
  int failed = 0;
  do {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 2;
    fcntl(pair[1], F_SETFL, O_NONBLOCK);
    h2_watch(pair[1], 0);
    open_n = 0, next_stream = 0;
    if (sendto(pair[0], "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24, 0, NULL, 0) != 24) return 2;
    uint8_t preface[24];
    size_t have = 0;
    while (have < 24) {
      ssize_t n = g_recv(pair[1], preface + have, 24 - have, 0);
      if (n > 0) have += (size_t)n;
    }
    for (int k = 0; k < 50 && !failed; ++k, ++steps) {
      failed = !step(pair[0], pair[1]);
      if (below(3) == 0) server_ends(pair[1], pair[0]);
    }
    g_close(pair[1]), close(pair[0]);
    connections++;
    if (!failed) failed = !public_connection(), publics++;
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (!failed && (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  printf("fuzz_guard: %ld connections, %ld steps, %ld public connections (%lu calls refused; %ld ids handed out, %ld of "
         "them marked cancelled), %d failures\n", connections, steps, publics, refused_calls, ids_seen, ids_marked, failed);
  return failed;
}
