//! The library's error type: a status kind plus a message that says what went wrong and what to do.

use std::fmt;

/// What kind of failure happened; each maps to one `AccallocStatus` at the C boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    InvalidDevice,
    InvalidPointer,
    OutOfMemory,
    Backend,
    NotSupported,
    Config,
    BufferTooSmall,
    Internal,
}

/// An error with its kind and a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_device(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidDevice, message)
    }
    pub fn invalid_pointer(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidPointer, message)
    }
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
