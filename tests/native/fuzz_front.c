/* The HTTP checks inside tritonserver's reads (server/triton/front/http_front.c with http_checks.c), under AddressSanitizer
 * and UBSan, on a socket pair: each round a client sends a few requests (good ones, ones the checks refuse, heads and
 * bodies with bytes flipped, cut or repeated, random bytes), split at random points, while the program reads them as
 * tritonserver does (read, readv over several buffers, recv; rooms of 1 byte up), with FIONREAD asked as libevent
 * asks it. What the reads hand out must be exactly the requests that pass, whole and in order (an Expect line left
 * out), up to the first refused one, and then the end of the stream; a refused request gets an answer marked
 * x-edge: refused. Random bytes: whatever is handed out must be whole requests the checks pass. Then tritonserver's
 * answers to what it was handed (Content-Length or chunked bodies, random bytes in them, written in random pieces
 * over several buffers; now and then random bytes) are followed: once each request is answered, the front counts
 * none still running. And once: a request past the waiting bound is refused with 503 until one is answered.
 * With a cancelled-calls table (call_ids.h): each inference request handed out carries one x-edge-call line of 16 hex
 * digits after its request line, and no line of the client's own; the ids of a connection forgotten before its
 * answers are in the table, those of one answered first (the client never hung up) are not.
 *
 *   fuzz_front SECONDS SEED   (prints "N rounds, 0 failures"; exit 0 when none failed) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../../tpserve/server/triton/front/bounds.h"
#include "../../tpserve/server/triton/front/call_ids.h"
#include "../../tpserve/server/triton/front/http_checks.h"
#include "../../tpserve/server/triton/front/http_front.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static const char RULES[] =
    "{\"models\": {\"m\": {\"max_batch_size\": 8, \"inputs\": {\"x\": {\"datatype\": \"FP32\", \"dims\": [-1]}}}},"
    " \"max_tensor_bytes\": 268435456, \"max_depth\": 32, \"max_keys\": 64, \"max_items\": 64,"
    " \"refused_override_keys\": [\"backend\"]}";

typedef struct {
  char *bytes;
  size_t len, room;
} buffer;

static void put(buffer *b, const void *bytes, size_t n) {
  if (n == 0) return;
  if (b->len + n > b->room) {
    b->room = (b->len + n) * 2 + 64;
    b->bytes = realloc(b->bytes, b->room);
  }
  memcpy(b->bytes + b->len, bytes, n);
  b->len += n;
}

static void puts_(buffer *b, const char *text) { put(b, text, strlen(text)); }

/* One request: `sent` as the client writes it, `handed` as tritonserver must read it; good: whether it passes. */
static int request(buffer *sent, buffer *handed, int kind) {
  char head[512], body[70000];
  size_t n = 0;
  int good = 1, expect = below(4) == 0;
  const char *path = "/v2/models/m/infer";
  if (kind == 0) { /* a good inference request, of a size that spans several reads sometimes */
    size_t values = below(4) == 0 ? 1 + below(9000) : 1 + below(8);
    n = (size_t)snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,%zu],\"datatype\":\"FP32\",\"data\":[", values);
    for (size_t i = 0; i < values; i++) n += (size_t)snprintf(body + n, sizeof body - n, i ? ",%zu" : "%zu", i % 10);
    n += (size_t)snprintf(body + n, sizeof body - n, "]}]}");
  } else if (kind == 1) { /* refused by the checks */
    n = (size_t)snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,2147483648],\"datatype\":\"FP32\",\"data\":[1]}]}");
    good = 0;
  } else if (kind == 2) { /* a GET, no body */
    path = "/v2/health/ready";
    expect = 0;
  } else { /* a head the front refuses */
    static const char *const bad[] = {"Transfer-Encoding: chunked\r\n", "Content-Length: 5\r\nContent-Length: 5\r\n",
                                      " folded\r\n", "Bad Name: x\r\n", "Expect: something\r\n"};
    int h = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\n%s\r\n", path, bad[below(5)]);
    put(sent, head, (size_t)h);
    return 0;
  }
  int h = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\n", kind == 2 ? "GET" : "POST", path);
  put(sent, head, (size_t)h);
  put(handed, head, (size_t)h);
  if (expect) puts_(sent, "Expect: 100-continue\r\n");
  if (below(5) == 0) puts_(sent, below(2) ? "X-Edge-Call: 00000000000000ff\r\n" : "x-edge-call:1\r\n"); /* left out */
  if (kind != 2) {
    h = snprintf(head, sizeof head, "Content-Length: %zu\r\n", n);
    put(sent, head, (size_t)h);
    put(handed, head, (size_t)h);
  }
  puts_(sent, "\r\n"), puts_(handed, "\r\n");
  put(sent, body, n), put(handed, body, n);
  return good;
}

static void mutate(buffer *b) {
  if (b->len == 0) return;
  size_t at = below(b->len);
  switch (below(4)) {
  case 0: b->bytes[at] = (char)next(); break;
  case 1: b->len = at; break;
  case 2: b->bytes[at] = "\r\n :0123456789{}[]\""[below(19)]; break;
  default: {
    size_t n = below(b->len - at + 1);
    char *piece = malloc(n + 1);
    memcpy(piece, b->bytes + at, n);
    put(b, piece, n);
    free(piece);
  }
  }
}

static int failures = 0;

static void fail(const char *what, size_t round) {
  if (failures++ < 10) fprintf(stderr, "round %zu: %s\n", round, what);
}

/* tritonserver's read, as one of the calls it makes, with room for 1 byte up */
static ssize_t read_some(int fd, char *into, size_t room) {
  size_t want = 1 + below(below(3) ? 8192 : 16);
  if (want > room) want = room;
  int available = -1;
  ioctl(fd, FIONREAD, &available); /* as libevent asks before it reads */
  if (available < 0) return -9;
  struct iovec parts[3];
  switch (below(3)) {
  case 0: return front_read(fd, &(struct iovec){into, want}, 1);
  case 1: {
    size_t first = below(want + 1);
    parts[0] = (struct iovec){into, first}, parts[1] = (struct iovec){into + first, want - first};
    return front_read(fd, parts, 2);
  }
  default: {
    size_t a = below(want + 1), b = below(want - a + 1);
    parts[0] = (struct iovec){into, a}, parts[1] = (struct iovec){into + a, 0}, parts[2] = (struct iovec){into + a, b};
    return a + b ? front_read(fd, parts, 3) : front_read(fd, &(struct iovec){into, want}, 1);
  }
  }
}

static size_t recv_calls, ioctl_calls; /* the front's socket calls, counted */

static ssize_t recv_counted(int fd, void *into, size_t len, int flags) {
  recv_calls++;
  return recv(fd, into, len, flags);
}

static int ioctl_wrapper(int fd, unsigned long request, ...) {
  va_list args;
  va_start(args, request);
  void *argument = va_arg(args, void *);
  va_end(args);
  ioctl_calls++;
  return ioctl(fd, request, argument);
}


/* One answer of tritonserver's: a Content-Length or a chunked body (random bytes, "HTTP/1.1" among them at times). */
static void answer(buffer *out) {
  char line[128];
  size_t n = below(4) ? below(64) : below(5000);
  if (below(3) == 0) {
    puts_(out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (size_t chunks = below(4); chunks > 0; chunks--) {
      size_t k = 1 + below(n + 1);
      snprintf(line, sizeof line, "%zx%s\r\n", k, below(4) ? "" : ";x=1");
      puts_(out, line);
      for (size_t i = 0; i < k; i++) put(out, below(50) ? &(char){(char)next()} : "\n", 1);
      puts_(out, "\r\n");
    }
    puts_(out, below(3) ? "0\r\n\r\n" : "0\r\nx-trailer: 1\r\n\r\n");
  } else {
    snprintf(line, sizeof line, "HTTP/1.1 %s\r\n%s: %zu\r\n\r\n", below(4) ? "200 OK" : "400 Bad Request",
             below(2) ? "Content-Length" : "content-length", n);
    puts_(out, line);
    size_t body = out->len;
    for (size_t i = 0; i < n; i++) put(out, &(char){(char)next()}, 1);
    for (size_t k = below(3); k > 0 && n >= 9; k--) memcpy(out->bytes + body + below(n - 8), "HTTP/1.1 ", 9);
  }
}

/* tritonserver answers every request it was handed, written in random pieces over random buffers: none runs then. */
static void answer_all(int fd, size_t round) {
  long running = (long)__atomic_load_n(&running_calls, __ATOMIC_RELAXED);
  buffer out = {0};
  for (long k = 0; k < running; k++) answer(&out);
  int garbage = below(20) == 0;
  if (garbage) for (size_t i = 0, n = below(3000); i < n; i++) put(&out, &(char){(char)next()}, 1);
  for (size_t at = 0; at < out.len;) {
    size_t n = 1 + below(below(3) ? 16 : out.len - at), first = below(n + 1);
    if (n > out.len - at) n = out.len - at;
    if (first > n) first = n;
    struct iovec parts[2] = {{out.bytes + at, first}, {out.bytes + at + first, n - first}};
    front_wrote(fd, parts, 2, n);
    at += n;
  }
  if (!garbage && __atomic_load_n(&running_calls, __ATOMIC_RELAXED) != 0) fail("answered requests still count", round);
  free(out.bytes);
}

static uint64_t *table; /* the cancelled-calls table, as the models map it */

/* The ids handed out in got (each an x-edge-call line after a request line), taken out of it, into ids; how many
 * (-1: a line that is not 16 hex digits). */
static long take_ids(buffer *got, uint64_t *ids, size_t room) {
  static const char line[] = "\r\nx-edge-call: ";
  long count = 0;
  for (char *at = got->bytes; got->len && (at = memmem(at, got->len - (size_t)(at - got->bytes), line, sizeof line - 1));) {
    char *id = at + sizeof line - 1;
    if ((size_t)(id - got->bytes) + 18 > got->len || memcmp(id + 16, "\r\n", 2) != 0) return -1;
    char hex[17] = {0};
    memcpy(hex, id, 16);
    if (strspn(hex, "0123456789abcdef") != 16) return -1;
    if ((size_t)count < room) ids[count] = strtoull(hex, NULL, 16);
    count++;
    size_t cut = sizeof line - 3 + 18; /* the line after the CRLF before it */
    memmove(at + 2, at + 2 + cut, got->len - (size_t)(at + 2 + cut - got->bytes));
    got->len -= cut;
    at += 2;
  }
  return count;
}

static size_t count_of(const buffer *b, const char *text) {
  size_t n = 0, len = strlen(text);
  for (const char *at = b->bytes; b->len && (at = memmem(at, b->len - (size_t)(at - b->bytes), text, len)); at += len) n++;
  return n;
}

static void round_of(size_t round) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return fail("socketpair", round);
  fcntl(pair[0], F_SETFL, O_NONBLOCK), fcntl(pair[1], F_SETFL, O_NONBLOCK);
  if (front_accepted(pair[0]) != 0) return fail("not watched", round);
  buffer sent = {0}, handed = {0}, got = {0}, answers = {0};
  int random_bytes = below(12) == 0, mutated = !random_bytes && below(3) == 0, refused = 0;
  if (random_bytes) {
    for (size_t i = 0, n = below(3000); i < n; i++) put(&sent, &(char){(char)next()}, 1);
  } else {
    for (size_t r = 0, count = 1 + below(4); r < count && !refused; r++) {
      int kind = below(6) < 3 ? 0 : (int)below(4);
      buffer piece = {0}, piece_handed = {0};
      int good = request(&piece, &piece_handed, kind);
      if (mutated && below(2)) mutate(&piece), good = -1; /* unknown: only the general property holds */
      put(&sent, piece.bytes, piece.len);
      if (good == 1) put(&handed, piece_handed.bytes, piece_handed.len);
      if (good != 1) refused = 1;
      free(piece.bytes), free(piece_handed.bytes);
    }
  }
  size_t written = 0;
  char into[8192];
  int ended = 0, closed = 0;
  for (int step = 0; step < 200000 && !ended; step++) {
    if (written < sent.len && below(2)) {
      size_t n = 1 + below(below(4) ? 64 : 20000);
      if (n > sent.len - written) n = sent.len - written;
      ssize_t w = write(pair[1], sent.bytes + written, n);
      if (w > 0) written += (size_t)w;
    } else if (written == sent.len && !closed && below(50) == 0) {
      shutdown(pair[1], SHUT_WR), closed = 1; /* the client is done: a cut request ends the stream */
    } else {
      ssize_t r = read_some(pair[0], into, sizeof into);
      if (r == -9) return fail("FIONREAD failed", round);
      if (r > 0) put(&got, into, (size_t)r);
      if (r == 0) ended = 1;
      if (r < 0 && errno != EAGAIN) return fail("a read failed other than EAGAIN", round);
    }
    char drain[4096];
    ssize_t answered;
    while ((answered = read(pair[1], drain, sizeof drain)) > 0) put(&answers, drain, (size_t)answered); /* the front's own */
  }
  if (!ended && written == sent.len && closed) fail("the stream never ended", round);
  if (!random_bytes && !mutated && refused && (answers.len == 0 || !memmem(answers.bytes, answers.len, "x-edge: refused", 15)))
    fail("a refused request got no refusal", round);
  uint64_t ids[64];
  long found = !random_bytes && !mutated ? take_ids(&got, ids, 64) : 0;
  if (found < 0) fail("an x-edge-call line is not 16 hex digits", round);
  if (!random_bytes && !mutated) { /* exactly the good requests, in order, each inference with its id */
    if (found != (long)count_of(&handed, "POST /v2/models/m/infer HTTP/1.1\r\n"))
      fail("an inference request was handed out without its id (or with two)", round);
    if (got.len != handed.len || (got.len && memcmp(got.bytes, handed.bytes, got.len) != 0)) {
      char what[200];
      snprintf(what, sizeof what, "handed out %zu bytes, expected %zu (refused %d)", got.len, handed.len, refused);
      fail(what, round);
    }
  } else if (got.len > 0) { /* whatever was handed out: whole requests that pass */
    size_t at = 0;
    while (at < got.len) {
      const char *end = memmem(got.bytes + at, got.len - at, "\r\n\r\n", 4);
      if (end == NULL) {
        fail("a partial head was handed out", round);
        if (getenv("FUZZ_SHOW")) fprintf(stderr, "got %zu at %zu: [%.*s]\nsent: [%.*s]\n", got.len, at, (int)got.len, got.bytes, (int)sent.len, sent.bytes);
        break;
      }
      size_t head = (size_t)(end - (got.bytes + at)) + 4, body = 0;
      char *copy = strndup(got.bytes + at, head); /* header names in any case, spaces after the colon */
      const char *length = strcasestr(copy, "\r\ncontent-length:");
      if (length) body = strtoul(length + 17, NULL, 10);
      free(copy);
      if (at + head + body > got.len) { fail("a partial body was handed out", round); break; }
      at += head + body;
    }
  }
  int hang_up = below(4) == 0; /* the connection closed before its answers: nobody waits for them */
  if (hang_up) front_forget(pair[0]);
  answer_all(pair[0], round);
  front_forget(pair[0]);
  if (__atomic_load_n(&running_calls, __ATOMIC_RELAXED) != 0) fail("a forgotten connection's requests still count", round);
  for (long i = 0; i < found && i < 64; i++) {
    int marked = table[ids[i] % CALL_SLOTS] == ids[i];
    if (hang_up && !marked) fail("a call its client left is not in the table", round);
    if (!hang_up && !closed && marked) fail("an answered call is in the table", round);
  }
  running_calls = 0;
  close(pair[0]), close(pair[1]);
  free(sent.bytes), free(handed.bytes), free(got.bytes), free(answers.bytes);
}

/* A request already whole in the socket is handed out with three socket calls: the head's peek, the read of all
 * but its final byte, that byte (the peek saw it: no FIONREAD, no second peek). */
static void socket_calls(void) {
  int pair[2];
  char into[4096];
  socketpair(AF_UNIX, SOCK_STREAM, 0, pair);
  for (int i = 0; i < 2; i++) fcntl(pair[i], F_SETFL, O_NONBLOCK);
  front_accepted(pair[0]);
  static const char whole[] = "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 68\r\n\r\n"
                              "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,1],\"datatype\":\"FP32\",\"data\":[1]}]}";
  (void)!write(pair[1], whole, sizeof whole - 1);
  recv_calls = ioctl_calls = 0;
  size_t id_line = sizeof CALL_ID_NAME + 1 + CALL_ID_HEX + 2;
  if (front_read(pair[0], &(struct iovec){into, sizeof into}, 1) != (ssize_t)(sizeof whole - 1 + id_line))
    fail("a whole request was not handed out in one read", 0);
  if (recv_calls != 3 || ioctl_calls != 0) {
    fprintf(stderr, "a whole request took %zu recv and %zu ioctl calls (3 and 0 expected)\n", recv_calls, ioctl_calls);
    fail("a whole request took more socket calls than it needs", 0);
  }
  front_wrote(pair[0], &(struct iovec){(void *)"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 38}, 1, 38);
  front_forget(pair[0]);
  close(pair[0]), close(pair[1]);
}

/* The bounds, once: a head that does not arrive in time ends its connection; a body past the budget all connections
 * share is refused with 503 while another holds it, and fits once that one is gone. */
static void bounds(void) {
  int slow[2], first[2], second[2];
  char into[4096];
  socketpair(AF_UNIX, SOCK_STREAM, 0, slow), socketpair(AF_UNIX, SOCK_STREAM, 0, first), socketpair(AF_UNIX, SOCK_STREAM, 0, second);
  for (int i = 0; i < 2; i++) fcntl(slow[i], F_SETFL, O_NONBLOCK), fcntl(first[i], F_SETFL, O_NONBLOCK), fcntl(second[i], F_SETFL, O_NONBLOCK);
  front_accepted(slow[0]), front_accepted(first[0]), front_accepted(second[0]);
  (void)!write(slow[1], "POST /v2/models/m/infer HT", 26);
  if (front_read(slow[0], &(struct iovec){into, sizeof into}, 1) != -1 || errno != EAGAIN) fail("a partial head was not held", 0);
  static const char big[] = "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 600000\r\n\r\n{";
  (void)!write(first[1], big, sizeof big - 1);
  if (front_read(first[0], &(struct iovec){into, sizeof into}, 1) != -1) fail("a partial body was handed out", 0);
  (void)!write(second[1], big, sizeof big - 1);
  if (front_read(second[0], &(struct iovec){into, sizeof into}, 1) > 0) fail("a body past the budget was handed out", 0);
  ssize_t answered = read(second[1], into, sizeof into - 1);
  if (answered < 12 || memcmp(into, "HTTP/1.1 503", 12) != 0) fail("the refusal past the budget is not a 503", 0);
  front_forget(first[0]);
  int third[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, third), fcntl(third[0], F_SETFL, O_NONBLOCK), front_accepted(third[0]);
  (void)!write(third[1], big, sizeof big - 1);
  if (front_read(third[0], &(struct iovec){into, sizeof into}, 1) != -1 || errno != EAGAIN) fail("the budget was not given back", 0);
  struct timespec pause = {2, 0};
  nanosleep(&pause, NULL); /* past the head's 1.5 s (the body's 30 s are not up) */
  if (front_read(slow[0], &(struct iovec){into, sizeof into}, 1) != 0) fail("a slow head kept its connection", 0);
  if (front_read(third[0], &(struct iovec){into, sizeof into}, 1) != -1) fail("a body in time lost its connection", 0);
  int fds[] = {slow[0], slow[1], first[0], first[1], second[0], second[1], third[0], third[1]};
  for (int i = 0; i < 8; i++) front_forget(fds[i]), close(fds[i]);
  waiting_bound = 1; /* one request may run: the next is refused (503) until it is answered */
  int one[2], two[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, one), socketpair(AF_UNIX, SOCK_STREAM, 0, two);
  for (int i = 0; i < 2; i++) fcntl(one[i], F_SETFL, O_NONBLOCK), fcntl(two[i], F_SETFL, O_NONBLOCK);
  front_accepted(one[0]), front_accepted(two[0]);
  static const char small[] = "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 68\r\n\r\n"
                              "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,1],\"datatype\":\"FP32\",\"data\":[1]}]}";
  static const char probe[] = "GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n";
  (void)!write(one[1], small, sizeof small - 1);
  size_t id_line = sizeof CALL_ID_NAME + 1 + CALL_ID_HEX + 2; /* "x-edge-call: " 16 hex digits CRLF */
  if (front_read(one[0], &(struct iovec){into, sizeof into}, 1) != (ssize_t)(sizeof small - 1 + id_line)) fail("a request within the bound was held", 0);
  (void)!write(two[1], probe, sizeof probe - 1); /* not an inference: never refused for load */
  if (front_read(two[0], &(struct iovec){into, sizeof into}, 1) != (ssize_t)(sizeof probe - 1)) fail("a probe past the bound was held", 0);
  front_wrote(two[0], &(struct iovec){(void *)"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 38}, 1, 38);
  (void)!write(two[1], small, sizeof small - 1);
  if (front_read(two[0], &(struct iovec){into, sizeof into}, 1) > 0) fail("a request past the bound was handed out", 0);
  answered = read(two[1], into, sizeof into - 1);
  if (answered < 12 || memcmp(into, "HTTP/1.1 503", 12) != 0 || !memmem(into, (size_t)answered, "waiting bound", 13))
    fail("the refusal past the waiting bound is not a 503 that says so", 0);
  static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
  front_wrote(one[0], &(struct iovec){(void *)reply, sizeof reply - 1}, 1, sizeof reply - 1);
  (void)!write(one[1], small, sizeof small - 1);
  if (front_read(one[0], &(struct iovec){into, sizeof into}, 1) <= 0) fail("a request after the answer was held", 0);
  front_forget(one[0]), front_forget(two[0]);
  for (int i = 0; i < 2; i++) close(one[i]), close(two[i]);
  waiting_bound = 0, running_calls = 0;
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: fuzz_front SECONDS SEED\n"), 2;
  double seconds = atof(argv[1]);
  state ^= strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull;
  char path[] = "/tmp/fuzz_front_rulesXXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, RULES, sizeof RULES - 1) != (ssize_t)(sizeof RULES - 1)) return 2;
  close(fd);
  setenv("TRITON_GUARD_FRONT_HTTP", "8000", 1);
  setenv("TRITON_GUARD_RULES", path, 1);
  setenv("TRITON_GUARD_FRONT_LIMITS", "1000000,16384,1024,1000000,1500", 1); /* budget: one body; heads in 1.5 s */
  char calls[] = "/tmp/fuzz_front_callsXXXXXX";
  int table_fd = mkstemp(calls); /* 0600 */
  if (table_fd < 0 || ftruncate(table_fd, (off_t)CALL_SLOTS * 8) != 0) return 2;
  table = mmap(NULL, (size_t)CALL_SLOTS * 8, PROT_READ, MAP_SHARED, table_fd, 0);
  close(table_fd);
  if (table == MAP_FAILED) return 2;
  setenv("TRITON_CANCELLED_CALLS", calls, 1);
  call_ids_start();
  unlink(calls);
  struct front_io io = {recv_counted, write, ioctl_wrapper, close};
  int started = front_start(&io);
  unlink(path);
  if (started != 0 || !front_port(8000)) return fprintf(stderr, "the front did not start\n"), 2;
  socket_calls();
  bounds();
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  size_t rounds = 0;
  do {
    for (int i = 0; i < 20; i++) round_of(rounds++);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  printf("%zu rounds, %d failures\n", rounds, failures);
  return failures != 0;
}
