// The few CUDA runtime types and functions that PyTorch's c10/cuda headers name, declared by accalloc
// so that accalloc.torch.use_for_cuda builds against PyTorch's own headers alone.
//
// Why: the CUDA runtime wheel a CUDA build of torch installs ships cuda_runtime_api.h without the crt/
// headers it includes, so a stock PyTorch environment cannot compile against it. The extension only
// subclasses CUDAPluggableAllocator and passes streams through as opaque pointers: it needs the
// types' names (they appear in the mangled names of libtorch_cuda's functions) and the ABI of the
// handful of functions c10's inline code calls, nothing else. The names and values are the CUDA
// runtime's (stable across CUDA 11, 12 and 13); tests load the built extension with every symbol bound
// (RTLD_NOW), so a name that did not match libtorch_cuda's would fail there.
//
// This folder is on the include path of that one extension only, and only these files are in it.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphNode_st* cudaGraphNode_t;
typedef struct CUuserObject_st* cudaUserObject_t;

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaUserObjectFlags {
  cudaUserObjectNoDestructorSync = 1,
};

enum cudaUserObjectRetainFlags {
  cudaGraphUserObjectMove = 1,
};

typedef void (*cudaHostFn_t)(void* userData);

cudaError_t cudaGetLastError(void);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least_priority, int* greatest_priority);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode);
cudaError_t cudaUserObjectCreate(cudaUserObject_t* object, void* ptr, cudaHostFn_t destroy, unsigned int initial_refcount,
                                 unsigned int flags);
cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count);
cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count, unsigned int flags);
// CUDA_VERSION stays undefined here, so c10's inline capture-info helper names the CUDA 12 form. The
// extension never calls that helper; were it ever to, the symbol would fail the RTLD_NOW load test.
cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream, enum cudaStreamCaptureStatus* status,
                                        unsigned long long* id, cudaGraph_t* graph,
                                        const cudaGraphNode_t** dependencies, size_t* dependency_count);

#ifdef __cplusplus
}
#endif
