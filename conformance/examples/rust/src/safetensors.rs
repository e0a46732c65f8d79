//! The safetensors container (SPEC 6.3–6.5): parsing and checking a header, and writing the
//! adapter's output file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use crate::dtype::{self, MAX_SIZE};
use crate::error::Result;
use crate::fail;
use crate::json::{self, Int, JsonError, Value};

/// MAX_SAFETENSORS_HEADER_BYTES (SPEC 6.3 rule 1, 12).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One entry of a header (SPEC 6.3 rule 5).
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// Rule 1: the header length N from the first 8 bytes of a file of `size` bytes.
pub fn header_length(first8: &[u8], size: u64, rel: &str) -> Result<u64> {
    if size < 8 || first8.len() < 8 {
        fail!("st-header-length", "{rel:?} has {size} bytes, fewer than 8");
    }
    let n = u64::from_le_bytes(first8[..8].try_into().unwrap());
    if n > MAX_HEADER_BYTES {
        fail!("st-header-length", "{rel:?}: header length {n} is over {MAX_HEADER_BYTES}");
    }
    if 8 + n > size {
        fail!("st-header-length", "{rel:?}: header length {n} runs past the file's {size} bytes");
    }
    Ok(n)
}

fn int_in(v: &Value, max: u64) -> Option<u64> {
    match v.int() {
        Int::Value(n) if n <= max => Some(n),
        _ => None,
    }
}

/// Rules 2–7 for a header of `header.len()` bytes in a file with `data_len` data bytes.
pub fn parse_header(header: &[u8], data_len: u64, rel: &str) -> Result<Vec<Entry>> {
    // rule 2: '{' first, UTF-8, one JSON object, then only spaces
    if header.first() != Some(&b'{') {
        fail!("st-header-json", "{rel:?}: the header does not start with '{{'");
    }
    let text = match std::str::from_utf8(header) {
        Ok(t) => t,
        Err(e) => fail!("st-header-json", "{rel:?}: the header is not UTF-8: {e}"),
    };
    let (root, end) = match json::parse_value(text, 0) {
        Ok(v) => v,
        Err(JsonError::Duplicate(name)) => {
            fail!("st-duplicate-key", "{rel:?}: the header has the name {name:?} twice")
        }
        Err(JsonError::TooDeep) => fail!("st-header-json", "{rel:?}: the header nests too deep"),
        Err(JsonError::Syntax(m) | JsonError::Encoding(m)) => {
            fail!("st-header-json", "{rel:?}: the header is not valid JSON: {m}")
        }
        Err(JsonError::Nonfinite(m)) => {
            fail!("st-header-json", "{rel:?}: the header has a non-finite number {m}")
        }
    };
    if header[end..].iter().any(|b| *b != b' ') {
        fail!("st-header-json", "{rel:?}: the header's JSON is followed by bytes other than \
               spaces");
    }
    let Value::Obj(members) = root else {
        fail!("st-header-json", "{rel:?}: the header is not a JSON object");
    };
    let mut entries = Vec::with_capacity(members.len());
    for (name, v) in members {
        // rule 4
        if name == "__metadata__" {
            match &v {
                Value::Obj(m) if m.iter().all(|(_, x)| matches!(x, Value::Str(_))) => continue,
                _ => fail!("st-metadata", "{rel:?}: __metadata__ is not a string-to-string map"),
            }
        }
        entries.push(parse_entry(rel, &name, &v)?);
    }
    // rule 7: the entries tile the data region exactly
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by_key(|e| (e.begin, e.end));
    let mut position = 0u64;
    for e in order {
        if e.begin != position {
            fail!("st-offsets", "{rel:?}: entry {:?} begins at {}, expected {position} (overlap or \
                   hole)", e.name, e.begin);
        }
        position = e.end;
    }
    if position != data_len {
        fail!("st-offsets", "{rel:?}: entries end at {position}, the data region has {data_len} \
               bytes");
    }
    Ok(entries)
}

/// Rules 5–6 for one member other than `__metadata__`.
fn parse_entry(rel: &str, name: &str, v: &Value) -> Result<Entry> {
    let Value::Obj(m) = v else { fail!("st-entry", "{rel:?}: entry {name:?} is not an object") };
    let mut names: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    if names != ["data_offsets", "dtype", "shape"] {
        fail!("st-entry", "{rel:?}: entry {name:?} has members {names:?}, not exactly dtype, \
               shape and data_offsets");
    }
    let Some(Value::Str(dt)) = v.get("dtype") else {
        fail!("st-entry", "{rel:?}: entry {name:?}: dtype is not a string")
    };
    let shape = match v.get("shape") {
        Some(Value::Arr(dims)) if dims.len() <= 64 => {
            dims.iter().map(|d| int_in(d, MAX_SIZE)).collect::<Option<Vec<u64>>>()
        }
        _ => None,
    };
    let Some(shape) = shape else {
        fail!("st-entry", "{rel:?}: entry {name:?}: shape is not an array of at most 64 \
               integers in 0..MAX_SIZE")
    };
    let (begin, end) = match v.get("data_offsets") {
        Some(Value::Arr(o)) if o.len() == 2 => (int_in(&o[0], MAX_SIZE), int_in(&o[1], MAX_SIZE)),
        _ => (None, None),
    };
    let (Some(begin), Some(end)) = (begin, end) else {
        fail!("st-entry", "{rel:?}: entry {name:?}: data_offsets is not two integers in \
               0..MAX_SIZE")
    };
    if begin > end {
        fail!("st-entry", "{rel:?}: entry {name:?}: data_offsets begin {begin} after end {end}");
    }
    let Some(bits) = dtype::bits(dt) else {
        fail!("st-dtype", "{rel:?}: entry {name:?} has the unknown dtype {dt:?}");
    };
    // rule 6
    match dtype::byte_count(&shape, bits) {
        Some(bytes) if bytes == end - begin => {}
        Some(bytes) => fail!("st-size", "{rel:?}: entry {name:?} spans {} bytes, its shape \
                             {shape:?} of {dt} needs {bytes}", end - begin),
        None => fail!("st-size", "{rel:?}: entry {name:?}: shape {shape:?} of {dt} is not a \
                      whole number of bytes within MAX_SIZE"),
    }
    Ok(Entry { name: name.to_string(), dtype: dt.clone(), shape, begin, end })
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A tensor to write: name, dtype, shape, bytes.
pub struct OutTensor<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [u64],
    pub bytes: &'a [u8],
}

/// Write a plain safetensors file (SPEC 6.3) under a temporary name, then rename it.
pub fn write_file(path: &Path, tensors: &[OutTensor]) -> io::Result<()> {
    let mut header = String::from("{");
    let mut position = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        let end = position + t.bytes.len() as u64;
        header.push_str(&format!("{}:{{\"dtype\":{},\"shape\":[{}],\"data_offsets\":[{position},{end}]}}",
                                 quote(t.name), quote(t.dtype), dims.join(",")));
        position = end;
    }
    header.push('}');
    while (8 + header.len()) % 8 != 0 {
        header.push(' '); // the data region starts at a multiple of 8 (SPEC 6.3 rule 8)
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let result = (|| {
        let mut f = io::BufWriter::new(File::create(&tmp)?);
        f.write_all(&(header.len() as u64).to_le_bytes())?;
        f.write_all(header.as_bytes())?;
        for t in tensors {
            f.write_all(t.bytes)?;
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(s: &str) -> Result<Vec<Entry>> {
        parse_header(s.as_bytes(), 8, "t")
    }

    #[test]
    fn header_rules() {
        let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}  "#;
        assert_eq!(header(ok).unwrap().len(), 1);
        let code = |s: &str| header(s).unwrap_err().code;
        assert_eq!(code(r#" {}"#), "st-header-json");
        assert_eq!(code("{}\t"), "st-header-json");
        assert_eq!(code(r#"{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}"#), "st-dtype");
        assert_eq!(code(r#"{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}"#), "st-entry");
        assert_eq!(code(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#), "st-size");
        assert_eq!(code(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#), "st-offsets");
        assert_eq!(code(r#"{"__metadata__":{"k":1}}"#), "st-metadata");
        assert_eq!(code(r#"{"a":1,"a":2}"#), "st-duplicate-key");
        assert_eq!(header_length(&[1, 0, 0, 0, 0, 0, 0, 0], 8, "t").unwrap_err().code,
                   "st-header-length");
    }
}
