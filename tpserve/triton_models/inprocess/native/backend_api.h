/* Triton's server and backend API as the in-process backend's C calls it: declared once, here (the signatures of
 * tritonserver 2.51's tritonbackend.h and tritonserver.h, with opaque handles as void* where the code passes them
 * through). */
#ifndef TPSERVE_BACKEND_API_H
#define TPSERVE_BACKEND_API_H

#include <stdint.h>

typedef struct TRITONSERVER_MetricFamily TRITONSERVER_MetricFamily;
typedef struct TRITONSERVER_Metric TRITONSERVER_Metric;
typedef struct TRITONSERVER_MetricArgs TRITONSERVER_MetricArgs;
typedef struct TRITONSERVER_Parameter TRITONSERVER_Parameter;
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
extern TRITONSERVER_Error* TRITONSERVER_ErrorNew(int code, const char* msg);
extern void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
extern TRITONSERVER_Error* TRITONBACKEND_RequestInput(void* request, const char* name, TRITONBACKEND_Input** input);
extern TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name, int* datatype,
                                                         const int64_t** shape, uint32_t* dims, uint64_t* byte_size,
                                                         uint32_t* buffer_count);
extern TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                                     uint64_t* byte_size, int* memory_type, int64_t* memory_type_id);
extern TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(void* request, uint32_t* count);
extern TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(void* request, uint32_t index, const char** name);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseNew(void** response, void* request);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(void* response, void** output, const char* name, int datatype,
                                                        const int64_t* shape, uint32_t dims);
extern TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(void* output, void** buffer, uint64_t byte_size, int* memory_type,
                                                      int64_t* memory_type_id);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseSend(void* response, uint32_t flags, TRITONSERVER_Error* error);
extern TRITONSERVER_Error* TRITONBACKEND_RequestRelease(void* request, uint32_t flags);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(void* instance, void* request, _Bool ok,
                                                                       uint64_t exec_start, uint64_t compute_start,
                                                                       uint64_t compute_end, uint64_t exec_end);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(void* instance, uint64_t batch_size,
                                                                            uint64_t exec_start, uint64_t compute_start,
                                                                            uint64_t compute_end, uint64_t exec_end);
extern TRITONSERVER_Error* TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily** family, int kind,
                                                        const char* name, const char* description);
extern TRITONSERVER_Error* TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily* family);
extern TRITONSERVER_Error* TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs** args);
extern TRITONSERVER_Error* TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs* args, const double* buckets,
                                                               uint64_t count);
extern TRITONSERVER_Error* TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs* args);
extern TRITONSERVER_Error* TRITONSERVER_MetricNewWithArgs(TRITONSERVER_Metric** metric,
                                                          TRITONSERVER_MetricFamily* family,
                                                          const TRITONSERVER_Parameter** labels, uint64_t count,
                                                          const TRITONSERVER_MetricArgs* args);
extern TRITONSERVER_Error* TRITONSERVER_MetricDelete(TRITONSERVER_Metric* metric);
extern TRITONSERVER_Error* TRITONSERVER_MetricObserve(TRITONSERVER_Metric* metric, double value);
extern TRITONSERVER_Parameter* TRITONSERVER_ParameterNew(const char* name, int type, const void* value);
extern void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* parameter);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(void* instance, const char** name);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(void* instance, void** model);
extern TRITONSERVER_Error* TRITONBACKEND_ModelName(void* model, const char** name);
extern TRITONSERVER_Error* TRITONBACKEND_ModelVersion(void* model, uint64_t* version);

#endif
