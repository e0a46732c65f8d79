//! The dtype table of SPEC 6.4 and the size arithmetic of SPEC 6.5 and 12.

/// MAX_SIZE = 2^63 − 1 (SPEC 12).
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// (name, bits) for every dtype of SPEC 6.4 (safetensors 0.8 names).
const DTYPES: [(&str, u64); 22] = [
    ("BOOL", 8), ("U8", 8), ("I8", 8), ("I16", 16), ("U16", 16), ("I32", 32), ("U32", 32),
    ("I64", 64), ("U64", 64), ("F16", 16), ("BF16", 16), ("F32", 32), ("F64", 64), ("C64", 64),
    ("F8_E4M3", 8), ("F8_E5M2", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
    ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6),
];

/// The bits per element of a dtype name, if it is one (exact, case-sensitive).
pub fn bits(name: &str) -> Option<u64> {
    DTYPES.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// Element count of a shape (1 for `[]`), overflow-checked against MAX_SIZE (SPEC 7.1 rule 4):
/// in order, every partial product within MAX_SIZE, so `[2^62, 4, 0]` overflows.
pub fn element_count(shape: &[u64]) -> Option<u64> {
    let mut n: u64 = 1;
    for &d in shape {
        n = n.checked_mul(d).filter(|v| *v <= MAX_SIZE)?;
    }
    Some(n)
}

/// Bit count of a tensor's shape (SPEC 7.1 rule 4): its element count and its bit count both
/// within MAX_SIZE, else None (`shape-overflow`).
pub fn bit_count(shape: &[u64], bits: u64) -> Option<u64> {
    element_count(shape)?.checked_mul(bits).filter(|v| *v <= MAX_SIZE)
}

/// Byte count of a stored array (SPEC 6.5 rule 2): its bit count must be a multiple of 8 and
/// at most MAX_SIZE. None when it breaks the rule.
pub fn byte_count(shape: &[u64], bits: u64) -> Option<u64> {
    let count = element_count(shape)?;
    let total = count.checked_mul(bits).filter(|v| *v <= MAX_SIZE)?;
    if total % 8 != 0 {
        return None;
    }
    Some(total / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(bits("F6_E2M3"), Some(6));
        assert_eq!(bits("f32"), None);
        assert_eq!(element_count(&[]), Some(1));
        assert_eq!(element_count(&[1 << 62, 2]), None);
        assert_eq!(element_count(&[(1 << 62) - 1, 2]), Some((1 << 63) - 2));
        assert_eq!(element_count(&[1 << 62, 4, 0]), None); // in order (SPEC 7.1 rule 4)
        assert_eq!(element_count(&[0, 1 << 62, 4]), Some(0));
        assert_eq!(byte_count(&[3], 4), None);
        assert_eq!(byte_count(&[4], 6), Some(3));
        assert_eq!(byte_count(&[1 << 59], 8), Some(1 << 59));
        assert_eq!(byte_count(&[1 << 61], 8), None); // 2^64 bits
        assert_eq!(byte_count(&[1 << 61], 32), None);
        assert_eq!(bit_count(&[(1 << 57) + 1], 64), None); // elements fit, bits do not
        assert_eq!(bit_count(&[3], 4), Some(12)); // a tensor's shape need not fill bytes
    }
}
