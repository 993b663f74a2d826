//! A backend under another name: the same devices, memory, events and virtual memory, registered as
//! a device type of its own ("host" and "cuda" are taken, and a name is registered once). The
//! benchmark puts other devices in use with one; tests register many.

use super::{Backend, Wrapper};

/// `inner`, named `name`; every other call goes to `inner`.
pub struct Renamed<B> {
    name: String,
    inner: B,
}

impl<B: Backend> Renamed<B> {
    pub fn new(name: impl Into<String>, inner: B) -> Self {
        Renamed {
            name: name.into(),
            inner,
        }
    }
}

impl<B: Backend> Wrapper for Renamed<B> {
    fn inner(&self) -> &dyn Backend {
        &self.inner
    }
    fn name(&self) -> &str {
        &self.name
    }
}
