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

/// How many bytes of an input a message quotes at most: a 1 MB settings string must not become a
/// 1 MB message.
pub const QUOTE_LIMIT: usize = 64;

/// `text` for a message: whole when short, else its first QUOTE_LIMIT bytes (cut at a character
/// boundary), "..." and its length.
pub fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= QUOTE_LIMIT {
        return text.into();
    }
    let mut end = QUOTE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len()).into()
}

/// `text` in single quotes for a message, bounded as `bounded` does ('abc', or 'abc...' (N bytes)).
pub fn quote(text: &str) -> String {
    match bounded(text) {
        std::borrow::Cow::Borrowed(whole) => format!("'{whole}'"),
        std::borrow::Cow::Owned(_) => {
            let mut end = QUOTE_LIMIT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            format!("'{}...' ({} bytes)", &text[..end], text.len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_bounded() {
        assert_eq!(quote("abc"), "'abc'");
        assert_eq!(bounded("abc"), "abc");
        let long = "x".repeat(1 << 20);
        assert_eq!(
            quote(&long),
            format!("'{}...' (1048576 bytes)", "x".repeat(64))
        );
        assert_eq!(
            bounded(&long),
            format!("{}... (1048576 bytes)", "x".repeat(64))
        );
        let wide = "é".repeat(100);
        assert!(quote(&wide).starts_with(&format!("'{}...'", "é".repeat(32))));
    }
}
