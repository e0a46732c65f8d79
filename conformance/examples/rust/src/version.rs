//! format_version and the reader rules of SPEC 4.1–4.2.

use crate::error::{Finding, Result};
use crate::fail;
use crate::json::Value;

/// The version this reader implements (SPEC 4.1).
pub const SUPPORTED_MAJOR: u64 = 1;
pub const SUPPORTED_MINOR: u64 = 3;

/// MAJOR.MINOR: decimal integers of at most 6 digits without leading zeros (SPEC 4.1 rule 1).
pub fn parse_version(s: &str) -> Option<(u64, u64)> {
    let (major, minor) = s.split_once('.')?;
    let part = |p: &str| -> Option<u64> {
        let ok = !p.is_empty()
            && p.len() <= 6
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p == "0" || !p.starts_with('0'));
        if ok { p.parse().ok() } else { None }
    };
    Some((part(major)?, part(minor)?))
}

/// SPEC 4.2: returns whether the manifest is of a newer minor version (rule 3). A missing or
/// malformed version is left to the schema check (rule 1).
pub fn check_version(root: &Value, warnings: &mut Vec<Finding>) -> Result<bool> {
    let Some(Value::Str(s)) = root.get("format_version") else { return Ok(false) };
    let Some((major, minor)) = parse_version(s) else { return Ok(false) };
    if major != SUPPORTED_MAJOR {
        fail!("version-major",
              "format_version {s:?} has major version {major}; this reader implements \
               {SUPPORTED_MAJOR}.{SUPPORTED_MINOR}");
    }
    if minor > SUPPORTED_MINOR {
        warnings.push(Finding::new("version-newer-minor", format!(
            "format_version {s:?} is newer than {SUPPORTED_MAJOR}.{SUPPORTED_MINOR}: unknown \
             fields are ignored")));
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn pattern() {
        assert_eq!(parse_version("1.2"), Some((1, 2)));
        assert_eq!(parse_version("0.9"), Some((0, 9)));
        assert_eq!(parse_version("123456.0"), Some((123456, 0)));
        for bad in ["1", "1.02", "01.2", "1.2.3", "1.", ".2", "1234567.0", "1.2\n", "+1.2", "1.x"] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }
}
