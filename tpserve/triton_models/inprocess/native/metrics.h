/* The in-process backend's latency histogram (metrics.c): its family at backend start and end, each instance's
 * metric at instance start and end, and every request's report through it. */
#ifndef TPSERVE_METRICS_H
#define TPSERVE_METRICS_H

#include <stdint.h>

/* Reports a request's statistics to Triton and, when it succeeded, observes its time (exec_start to answered, or
 * to exec_end where answered is 0) in the instance's latency histogram (inprocess_metrics.c). */
void ipn_report(void* instance, void* request, int ok, uint64_t exec_start, uint64_t compute_start,
                uint64_t compute_end, uint64_t exec_end, uint64_t answered);
/* The histogram's family (backend start and end) and each instance's metric (instance start and end). */
void ipm_start(void);
void ipm_stop(void);
void ipm_instance_open(void* instance);
void ipm_instance_close(void* instance);

#endif
