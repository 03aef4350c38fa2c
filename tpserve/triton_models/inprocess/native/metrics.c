/* The in-process backend's own latency histogram, through Triton's custom metrics API.
 *
 * Triton's p99 summaries (--metrics-config=summary_latencies=true) are updated under the model's statistics lock,
 * five per request: at tens of thousands of requests a second that lock serializes the server. A histogram
 * costs one atomic bucket increment under the metric's own lock, so it stays on with the summaries off:
 *
 *   torch_inprocess_request_duration_ms{model, version, instance}: per successful request, the time from its
 *   batch's start in the backend (Triton handed it over: the queue is behind it) to its response sent, in ms.
 *
 * Queueing is Triton's counter nv_inference_queue_duration_us (the scale-out rule's), so the two together give
 * a request's whole time in the server. One metric per model instance (its labels name it), made when the
 * instance starts and deleted when it ends; every path that reports a request's statistics (Python's, the batch
 * calls', both native ones) reports through ipn_report, which observes it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "metrics.h"
#include "native.h"



enum { KIND_HISTOGRAM = 2, PARAMETER_STRING = 0, IPM_MAX_INSTANCES = 256 };

static const double BUCKETS_MS[] = {0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000};

static TRITONSERVER_MetricFamily* family;
static struct {
  void* instance;
  TRITONSERVER_Metric* metric;
} made[IPM_MAX_INSTANCES];
static int used; /* made[0 .. used) may hold an instance */
static pthread_rwlock_t made_lock = PTHREAD_RWLOCK_INITIALIZER;

void ipm_start(void) {
  if (family != NULL) return;
  const char* about =
      "Per successful request, its batch's start in the in-process backend to its response sent (ms); "
      "time in Triton's queue before it: nv_inference_queue_duration_us";
  if (!ipn_ok(TRITONSERVER_MetricFamilyNew(&family, KIND_HISTOGRAM, "torch_inprocess_request_duration_ms", about))) {
    family = NULL; /* the server serves on without the histogram */
  }
}

void ipm_stop(void) {
  if (family != NULL) ipn_ok(TRITONSERVER_MetricFamilyDelete(family));
  family = NULL;
}

static TRITONSERVER_Metric* new_metric(void* instance) {
  void* model = NULL;
  const char *model_name = NULL, *instance_name = NULL;
  uint64_t version = 0;
  if (!ipn_ok(TRITONBACKEND_ModelInstanceModel(instance, &model)) || !ipn_ok(TRITONBACKEND_ModelName(model, &model_name)) ||
      !ipn_ok(TRITONBACKEND_ModelVersion(model, &version)) ||
      !ipn_ok(TRITONBACKEND_ModelInstanceName(instance, &instance_name))) {
    return NULL;
  }
  char version_text[24];
  snprintf(version_text, sizeof version_text, "%llu", (unsigned long long)version);
  const TRITONSERVER_Parameter* labels[3] = {
      TRITONSERVER_ParameterNew("model", PARAMETER_STRING, model_name),
      TRITONSERVER_ParameterNew("version", PARAMETER_STRING, version_text),
      TRITONSERVER_ParameterNew("instance", PARAMETER_STRING, instance_name),
  };
  TRITONSERVER_MetricArgs* args = NULL;
  TRITONSERVER_Metric* metric = NULL;
  int ready = labels[0] && labels[1] && labels[2] && ipn_ok(TRITONSERVER_MetricArgsNew(&args)) &&
              ipn_ok(TRITONSERVER_MetricArgsSetHistogram(args, BUCKETS_MS, sizeof BUCKETS_MS / sizeof *BUCKETS_MS));
  if (ready && !ipn_ok(TRITONSERVER_MetricNewWithArgs(&metric, family, labels, 3, args))) metric = NULL;
  if (args != NULL) ipn_ok(TRITONSERVER_MetricArgsDelete(args));
  for (int k = 0; k < 3; ++k) {
    if (labels[k]) TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter*)labels[k]);
  }
  return metric;
}

void ipm_instance_open(void* instance) {
  if (family == NULL) return;
  TRITONSERVER_Metric* metric = new_metric(instance);
  if (metric == NULL) return;
  pthread_rwlock_wrlock(&made_lock);
  int k = 0;
  while (k < IPM_MAX_INSTANCES && made[k].instance != NULL) ++k;
  if (k < IPM_MAX_INSTANCES) made[k].instance = instance, made[k].metric = metric, used = k >= used ? k + 1 : used;
  pthread_rwlock_unlock(&made_lock);
  if (k == IPM_MAX_INSTANCES) ipn_ok(TRITONSERVER_MetricDelete(metric)); /* more instances than slots: unmeasured */
}

void ipm_instance_close(void* instance) {
  TRITONSERVER_Metric* metric = NULL;
  pthread_rwlock_wrlock(&made_lock);
  for (int k = 0; k < IPM_MAX_INSTANCES; ++k) {
    if (made[k].instance == instance) {
      metric = made[k].metric;
      made[k].instance = NULL, made[k].metric = NULL;
      break;
    }
  }
  pthread_rwlock_unlock(&made_lock);
  if (metric != NULL) ipn_ok(TRITONSERVER_MetricDelete(metric));
}

/* Observes the request's time (exec_start to exec_end) into the instance's histogram. The read lock is held while
 * observing: ipm_instance_close cannot delete the metric under it (Triton finalizes an instance only once its
 * requests are released, so this is only ever a safeguard). */
static void observe(void* instance, uint64_t exec_start, uint64_t exec_end) {
  pthread_rwlock_rdlock(&made_lock);
  for (int k = 0; k < used; ++k) {
    if (made[k].instance == instance) {
      double ms = exec_end > exec_start ? (double)(exec_end - exec_start) / 1e6 : 0.0;
      ipn_ok(TRITONSERVER_MetricObserve(made[k].metric, ms));
      break;
    }
  }
  pthread_rwlock_unlock(&made_lock);
}

void ipn_report(void* instance, void* request, int ok, uint64_t exec_start, uint64_t compute_start,
                uint64_t compute_end, uint64_t exec_end, uint64_t answered) {
  ipn_ok(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, ok != 0, exec_start, compute_start,
                                                     compute_end, exec_end));
  if (ok && family != NULL) observe(instance, exec_start, answered ? answered : exec_end);
}
