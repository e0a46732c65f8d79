//! Findings: an error stops the reader, a warning does not (SPEC 1.1, 13).

use std::fmt;

/// The section of each code, from the table of SPEC 13.
pub fn section_of(code: &str) -> &'static str {
    match code {
        "not-committed" => "2.3",
        "file-missing" | "file-duplicate" => "2.1",
        "path-unsafe" | "path-escapes" | "file-not-regular" => "2.2",
        "json-encoding" | "json-syntax" => "3.2",
        "json-duplicate-name" | "json-nonfinite" => "3.3",
        "json-too-large" | "json-too-deep" => "3.4",
        "schema" => "3.5",
        "version-major" | "version-newer-minor" => "4.2",
        "unknown-field" => "4.3",
        "extension-unsupported" | "extension-ignored" => "4.4",
        "layout-world-size" => "5.1",
        "layout-rank-order" => "5.2",
        "layout-ranks" => "5.3",
        "file-rank" => "6.1",
        "st-header-length" | "st-header-json" | "st-duplicate-key" | "st-entry"
        | "st-metadata" | "st-size" | "st-offsets" => "6.3",
        "st-dtype" => "6.4",
        "st-mismatch" | "st-missing-tensor" | "st-extra-tensor" | "piece-rank"
        | "piece-bounds" | "piece-duplicate" => "7.2",
        "shape-overflow" => "7.1",
        "coverage-gap" | "coverage-overlap" => "7.3",
        "replica-mismatch" => "7.4",
        "alias-target" => "7.6",
        "tie-target" | "tie-shape" | "tie-split" => "8.4",
        "file-size" => "9.1",
        "checksum-mismatch" => "9.2",
        "rank-out-of-range" => "11.1",
        _ => "11.1",
    }
}

/// A finding with its stable code (SPEC 13).
#[derive(Debug, Clone)]
pub struct Finding {
    pub code: &'static str,
    pub section: &'static str,
    pub message: String,
}

impl Finding {
    pub fn new(code: &'static str, message: impl Into<String>) -> Finding {
        Finding { code, section: section_of(code), message: message.into() }
    }
}

/// Errors and warnings print the same way: `[code] message (SPEC x.y)`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} (SPEC {})", self.code, self.message, self.section)
    }
}

pub type Error = Finding;
pub type Result<T> = std::result::Result<T, Error>;

/// `fail!(code, format...)`: return an error finding.
#[macro_export]
macro_rules! fail {
    ($code:expr, $($arg:tt)*) => {
        return Err($crate::error::Finding::new($code, format!($($arg)*)))
    };
}
