//! The CUresult values the model returns: only codes the real driver defines, since callers (cudarc
//! among them) read the result as an enum.

pub type CuResult = u32;

pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub const NO_DEVICE: CuResult = 100;
pub const INVALID_DEVICE: CuResult = 101;
pub const INVALID_CONTEXT: CuResult = 201;
pub const ALREADY_MAPPED: CuResult = 208;
pub const NOT_MAPPED: CuResult = 211;
pub const INVALID_HANDLE: CuResult = 400;
pub const NOT_READY: CuResult = 600;
pub const ILLEGAL_ADDRESS: CuResult = 700;
pub const CONTEXT_IS_DESTROYED: CuResult = 709;
pub const LAUNCH_FAILED: CuResult = 719;
pub const NOT_PERMITTED: CuResult = 800;
pub const NOT_SUPPORTED: CuResult = 801;
pub const STREAM_CAPTURE_UNSUPPORTED: CuResult = 900;
pub const STREAM_CAPTURE_INVALIDATED: CuResult = 901;
pub const STREAM_CAPTURE_WRONG_THREAD: CuResult = 908;
pub const ILLEGAL_STATE: CuResult = 401;
pub const UNKNOWN: CuResult = 999;

/// (code, name, description) for cuGetErrorName / cuGetErrorString, NUL-terminated.
const TABLE: [(CuResult, &str, &str); 21] = [
    (SUCCESS, "CUDA_SUCCESS\0", "no error\0"),
    (
        INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE\0",
        "invalid argument\0",
    ),
    (
        OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY\0",
        "out of memory\0",
    ),
    (
        NOT_INITIALIZED,
        "CUDA_ERROR_NOT_INITIALIZED\0",
        "initialization error\0",
    ),
    (
        NO_DEVICE,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        INVALID_DEVICE,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        INVALID_CONTEXT,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        ALREADY_MAPPED,
        "CUDA_ERROR_ALREADY_MAPPED\0",
        "resource already mapped\0",
    ),
    (
        NOT_MAPPED,
        "CUDA_ERROR_NOT_MAPPED\0",
        "resource not mapped\0",
    ),
    (
        INVALID_HANDLE,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (NOT_READY, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (
        ILLEGAL_ADDRESS,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        CONTEXT_IS_DESTROYED,
        "CUDA_ERROR_CONTEXT_IS_DESTROYED\0",
        "context is destroyed\0",
    ),
    (
        LAUNCH_FAILED,
        "CUDA_ERROR_LAUNCH_FAILED\0",
        "unspecified launch failure\0",
    ),
    (
        NOT_PERMITTED,
        "CUDA_ERROR_NOT_PERMITTED\0",
        "operation not permitted\0",
    ),
    (
        NOT_SUPPORTED,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        ILLEGAL_STATE,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (
        STREAM_CAPTURE_UNSUPPORTED,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
        "operation not permitted when stream is capturing\0",
    ),
    (
        STREAM_CAPTURE_INVALIDATED,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0",
        "operation failed due to a previous error during capture\0",
    ),
    (
        STREAM_CAPTURE_WRONG_THREAD,
        "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD\0",
        "attempted to end a stream capture from a different thread\0",
    ),
    (UNKNOWN, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

/// The code a fault rule names, by number or by name (with or without CUDA_ERROR_).
pub fn parse(text: &str) -> Option<CuResult> {
    if let Ok(code) = text.parse::<u32>() {
        return TABLE.iter().any(|(c, _, _)| *c == code).then_some(code);
    }
    TABLE.iter().find_map(|(code, name, _)| {
        let name = name.trim_end_matches('\0');
        (name == text || name.strip_prefix("CUDA_ERROR_") == Some(text)).then_some(*code)
    })
}

pub fn name(code: CuResult) -> Option<&'static str> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, _)| *n)
}

pub fn description(code: CuResult) -> Option<&'static str> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, _, d)| *d)
}

/// Errors after which the context is unusable: every later call on it returns the same code.
pub fn is_sticky(code: CuResult) -> bool {
    matches!(code, ILLEGAL_ADDRESS | LAUNCH_FAILED)
}
