//! The model's knobs, read once at cuInit from the environment.

pub const DEFAULT_DEVICES: usize = 2;
pub const MAX_DEVICES: usize = 64;
/// A 16 GiB card.
pub const DEFAULT_CAPACITY: usize = 16 << 30;
/// Page-locked host memory the host lets the driver pin, all contexts together.
pub const DEFAULT_PINNED_CAPACITY: usize = 4 << 30;
/// The VMM granularity, minimum and recommended alike: 2 MiB, as on NVIDIA GPUs.
pub const GRANULARITY: usize = 2 << 20;

pub struct Config {
    /// ACCALLOC_CUDA_MODEL_DEVICES.
    pub devices: usize,
    /// ACCALLOC_CUDA_MODEL_CAPACITY: bytes per device, with an optional K, M or G suffix.
    pub capacity: usize,
    /// ACCALLOC_CUDA_MODEL_PINNED_CAPACITY: bytes of host memory cuMemHostAlloc may pin in all (K,
    /// M, G); 0 pins nothing.
    pub pinned_capacity: usize,
    /// ACCALLOC_CUDA_MODEL_ON_VIOLATION: "abort" (the default: the test fails, whoever runs it) or
    /// "count" (a test reads accallocModelViolations). None: unset, the default stands.
    pub abort_on_violation: Option<bool>,
    /// ACCALLOC_CUDA_MODEL_FAIL: fault rules (faults.rs).
    pub faults: String,
}

/// "123", "64K", "512M", "16G" (binary units).
pub fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last()?.to_ascii_uppercase() {
        'K' => (&text[..text.len() - 1], 10),
        'M' => (&text[..text.len() - 1], 20),
        'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

impl Config {
    /// Err names the variable whose value makes no sense (cuInit then fails with
    /// CUDA_ERROR_INVALID_VALUE and says so on stderr).
    pub fn from_env() -> Result<Config, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let devices = match var("ACCALLOC_CUDA_MODEL_DEVICES") {
            None => DEFAULT_DEVICES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(format!(
                        "ACCALLOC_CUDA_MODEL_DEVICES={v}: 0 to {MAX_DEVICES}"
                    ))
                }
            },
        };
        let capacity = match var("ACCALLOC_CUDA_MODEL_CAPACITY") {
            None => DEFAULT_CAPACITY,
            Some(v) => match parse_bytes(&v) {
                Some(n) if n > 0 && n <= 1 << 40 => n,
                _ => {
                    return Err(format!(
                        "ACCALLOC_CUDA_MODEL_CAPACITY={v}: bytes (K, M, G), at most 1T"
                    ))
                }
            },
        };
        let pinned_capacity = match var("ACCALLOC_CUDA_MODEL_PINNED_CAPACITY") {
            None => DEFAULT_PINNED_CAPACITY,
            Some(v) => match parse_bytes(&v) {
                Some(n) if n <= 1 << 40 => n,
                _ => {
                    return Err(format!(
                        "ACCALLOC_CUDA_MODEL_PINNED_CAPACITY={v}: bytes (K, M, G), at most 1T"
                    ))
                }
            },
        };
        let abort_on_violation = match var("ACCALLOC_CUDA_MODEL_ON_VIOLATION").as_deref() {
            None => None,
            Some("abort") => Some(true),
            Some("count") => Some(false),
            Some(v) => {
                return Err(format!(
                    "ACCALLOC_CUDA_MODEL_ON_VIOLATION={v}: abort or count"
                ))
            }
        };
        Ok(Config {
            devices,
            capacity,
            pinned_capacity,
            abort_on_violation,
            faults: var("ACCALLOC_CUDA_MODEL_FAIL").unwrap_or_default(),
        })
    }
}
