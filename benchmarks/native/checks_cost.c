/* What the HTTP request checks (tpserve/server/triton/front/http_checks.c) cost one request, in the process: each request
 * read from stdin (the record format of tests/native/fuzz_checks.c's serve mode) is checked again and again for
 * about `seconds`, five times; the median nanoseconds of a check, and of copying its bytes once (what a guard that
 * takes a request whole copies), are printed as "INDEX\tSTATUS\tCHECK_NS\tCOPY_NS\tBYTES".
 *
 *   checks_cost RULES_FILE SECONDS < records */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../tpserve/server/triton/front/http_checks.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static char *read_exactly(size_t n) {
  char *out = malloc(n ? n : 1);
  if (n && fread(out, 1, n, stdin) != n) exit(3);
  return out;
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: checks_cost RULES_FILE SECONDS < records\n"), 2;
  FILE *f = fopen(argv[1], "rb");
  if (f == NULL) return perror(argv[1]), 2;
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text, f);
  fclose(f);
  char why[300];
  struct check_rules *rules = check_rules_load(text, n, why, sizeof why);
  if (rules == NULL) return fprintf(stderr, "%s\n", why), 2;
  double seconds = atof(argv[2]);
  size_t method_len, path_len, ce_len, hl_len, body_len;
  int ce_count, hl_count, index = 0;
  while (scanf("%zu %zu %d %zu %d %zu %zu", &method_len, &path_len, &ce_count, &ce_len, &hl_count, &hl_len, &body_len) == 7) {
    if (getchar() != '\n') return 3;
    char *method = read_exactly(method_len), *path = read_exactly(path_len), *ce = read_exactly(ce_len);
    char *hl = read_exactly(hl_len), *body = read_exactly(body_len), *copy = malloc(body_len + 1);
    struct check_request r = {method, method_len, path, path_len, ce_count ? ce : NULL, ce_len, ce_count,
                              hl_count ? hl : NULL, hl_len, hl_count, body, body_len, NULL, NULL};
    struct check_verdict v;
    double check[5], copied[5];
    for (int round = 0; round < 5; round++) {
      long count = 0;
      double start = now(), end;
      do {
        for (int i = 0; i < 16; i++, count++) check_http_request(rules, &r, &v);
      } while ((end = now()) - start < seconds / 10);
      check[round] = (end - start) / (double)count * 1e9;
      count = 0;
      start = now();
      do {
        for (int i = 0; i < 16; i++, count++) {
          memcpy(copy, body, body_len);
          __asm__ volatile("" : : "r"(copy) : "memory");
        }
      } while ((end = now()) - start < seconds / 20);
      copied[round] = (end - start) / (double)count * 1e9;
    }
    qsort(check, 5, sizeof check[0], by_value);
    qsort(copied, 5, sizeof copied[0], by_value);
    printf("%d\t%d\t%.0f\t%.0f\t%zu\n", index++, v.status, check[2], copied[2], body_len);
    fflush(stdout);
    free(method), free(path), free(ce), free(hl), free(body), free(copy);
  }
  check_rules_free(rules);
  return 0;
}
