// See cuda_runtime_api.h in this folder: c10/cuda/CUDAException.h includes the driver API header
// but names nothing of it that the extension uses.
#pragma once
