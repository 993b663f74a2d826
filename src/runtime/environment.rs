//! The process environment, read in one place: which ACCALLOC_ variables accalloc reads, and the one
//! rule that checks each value. The runtime reads them once, when it starts; the `accalloc` tool
//! checks them all with these same rules before any command, and its replays take their settings
//! from here, so no entry point reads a variable, or judges a value, its own way. (The caching core
//! reads no environment: it is given values.)

use crate::backend::host::{FailRule, HostSettings, CAPACITY_VAR, DEVICES_VAR, FAIL_VAR};
use crate::caching::settings::parse_settings;
use crate::caching::CachingConfig;
use crate::error::{Error, Result};

/// The allocator settings every device starts with (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax).
pub const ALLOC_CONF_VAR: &str = "ACCALLOC_CONF";
/// Which accelerator is current: "host" or "cuda"; unset means CUDA when a GPU is found.
pub const DEVICE_VAR: &str = "ACCALLOC_DEVICE";
/// A file to record every operation of the process into, as accalloc's trace.
pub const TRACE_VAR: &str = "ACCALLOC_TRACE";

/// Every variable accalloc reads.
pub const VARIABLES: [&str; 6] = [
    ALLOC_CONF_VAR,
    DEVICE_VAR,
    CAPACITY_VAR,
    DEVICES_VAR,
    FAIL_VAR,
    TRACE_VAR,
];

/// The values of the variables (None: unset; an empty ACCALLOC_TRACE too). A value that is not
/// UTF-8 is kept, lossily converted, so that its check refuses it rather than taking it as unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    pub alloc_conf: Option<String>,
    pub device: Option<String>,
    pub host_capacity: Option<String>,
    pub host_devices: Option<String>,
    pub host_fail: Option<String>,
    pub trace: Option<String>,
}

impl Environment {
    /// The process's environment now.
    pub fn read() -> Self {
        Self::from_lookup(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => Some(raw.to_string_lossy().into_owned()),
        })
    }

    /// The variables as `lookup` gives them (for tests, and for a caller with its own source).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Environment {
            alloc_conf: lookup(ALLOC_CONF_VAR),
            device: lookup(DEVICE_VAR),
            host_capacity: lookup(CAPACITY_VAR),
            host_devices: lookup(DEVICES_VAR),
            host_fail: lookup(FAIL_VAR),
            // An empty path records nothing: taken as unset here, once.
            trace: lookup(TRACE_VAR).filter(|path| !path.is_empty()),
        }
    }

    /// ACCALLOC_CONF's settings over PyTorch's defaults (the defaults when unset).
    pub fn initial_config(&self) -> Result<CachingConfig> {
        match &self.alloc_conf {
            None => Ok(CachingConfig::default()),
            Some(text) => parse_settings(text, &CachingConfig::default())
                .map_err(|e| Error::config(format!("{ALLOC_CONF_VAR}: {}", e.message))),
        }
    }

    /// ACCALLOC_DEVICE: Some("host") or Some("cuda"), None when unset.
    pub fn forced_device(&self) -> Result<Option<&str>> {
        match self.device.as_deref() {
            None => Ok(None),
            Some(value @ ("host" | "cuda")) => Ok(Some(value)),
            Some(value) => Err(Error::config(format!(
                "{DEVICE_VAR}={} is not a valid accelerator: give host or cuda (or leave it \
                 unset to use CUDA when a GPU is present)",
                crate::error::quote(value)
            ))),
        }
    }

    /// The host backend's layout: ACCALLOC_HOST_CAPACITY and ACCALLOC_HOST_DEVICES (unset: the
    /// machine's physical memory and one device), with ACCALLOC_HOST_FAIL's injected failures.
    pub fn host_settings(&self) -> Result<HostSettings> {
        let mut settings =
            HostSettings::from_values(self.host_capacity.as_deref(), self.host_devices.as_deref())?;
        if let Some(rules) = &self.host_fail {
            (settings.fail, settings.event_fail) = FailRule::parse_rules(rules)?;
        }
        Ok(settings)
    }

    /// ACCALLOC_TRACE's path, when set and not empty.
    pub fn trace_path(&self) -> Option<&str> {
        self.trace.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)]) -> Environment {
        Environment::from_lookup(|name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn unset_means_the_defaults() {
        let env = of(&[]);
        assert_eq!(env.initial_config().unwrap(), CachingConfig::default());
        assert_eq!(env.forced_device().unwrap(), None);
        assert_eq!(env.host_settings().unwrap().devices, 1);
        assert_eq!(env.trace_path(), None);
    }

    #[test]
    fn each_value_is_read_and_a_bad_one_names_its_variable() {
        let env = of(&[
            (DEVICE_VAR, "host"),
            (CAPACITY_VAR, "1GiB"),
            (DEVICES_VAR, "2"),
            (TRACE_VAR, ""),
        ]);
        assert_eq!(env.forced_device().unwrap(), Some("host"));
        let host = env.host_settings().unwrap();
        assert_eq!((host.capacity, host.devices), (1 << 30, 2));
        assert_eq!(env.trace_path(), None, "an empty path records nothing");
        for (name, value) in [
            (ALLOC_CONF_VAR, "bogus:1"),
            (DEVICE_VAR, "tpu"),
            (CAPACITY_VAR, "8GB"),
            (DEVICES_VAR, "0"),
            (FAIL_VAR, "alloc:sometimes"),
        ] {
            let env = of(&[(name, value)]);
            let error = match name {
                ALLOC_CONF_VAR => env.initial_config().err(),
                DEVICE_VAR => env.forced_device().err(),
                _ => env.host_settings().err(),
            };
            let message = error.expect(name).message;
            assert!(message.contains(name), "{name}={value}: {message}");
        }
    }
}
