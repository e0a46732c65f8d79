//! A strict JSON parser: RFC 8259 with the I-JSON restrictions of SPEC 3.3.
//!
//! Iterative (an explicit stack, no recursion), so the depth limit of SPEC 3.4 is enforced
//! without unbounded recursion. Numbers keep their exact token so integers are read exactly,
//! never through binary floating point (SPEC 3.3 rule 3).

use std::collections::HashSet;

/// MAX_JSON_DEPTH (SPEC 3.4, 12).
pub const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// The number's token as written.
    Num(String),
    Str(String),
    Arr(Vec<Value>),
    /// Members in document order; names are unique (checked while parsing).
    Obj(Vec<(String, Value)>),
}

/// What an integer token says, for range checks (SPEC 3.3 rule 3).
#[derive(Debug, PartialEq)]
pub enum Int {
    NotInteger,
    Negative,
    TooBig,
    Value(u64),
}

impl Value {
    /// The value as an exact integer, if it is a JSON integer token.
    pub fn int(&self) -> Int {
        let Value::Num(text) = self else { return Int::NotInteger };
        if text.contains(['.', 'e', 'E']) {
            return Int::NotInteger;
        }
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        if negative {
            // "-0" is the integer 0
            return if digits.bytes().all(|b| b == b'0') { Int::Value(0) } else { Int::Negative };
        }
        match digits.parse::<u64>() {
            Ok(v) => Int::Value(v),
            Err(_) => Int::TooBig,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Num(_) => "a number",
            Value::Str(_) => "a string",
            Value::Arr(_) => "an array",
            Value::Obj(_) => "an object",
        }
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Obj(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq)]
pub enum JsonError {
    /// Not RFC 8259 JSON (SPEC 3.2 rule 2).
    Syntax(String),
    /// An escaped lone surrogate (SPEC 3.2 rule 1).
    Encoding(String),
    /// A name twice in one object (SPEC 3.3 rule 1).
    Duplicate(String),
    /// NaN, Infinity or a number beyond binary64 (SPEC 3.3 rule 2).
    Nonfinite(String),
    /// Nesting above MAX_JSON_DEPTH (SPEC 3.4 rule 2).
    TooDeep,
}

enum Frame {
    Arr(Vec<Value>),
    /// members, names seen, the name of the member being parsed
    Obj(Vec<(String, Value)>, HashSet<String>, String),
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

/// Parse one JSON value starting at `start` (leading whitespace allowed). Returns the value
/// and the offset just past it; the caller decides what may follow.
pub fn parse_value(text: &str, start: usize) -> Result<(Value, usize), JsonError> {
    let mut p = Parser { b: text.as_bytes(), i: start };
    let v = p.value()?;
    Ok((v, p.i))
}

/// Parse a whole document: one value, surrounded only by RFC 8259 whitespace.
pub fn parse_document(text: &str) -> Result<Value, JsonError> {
    let (v, end) = parse_value(text, 0)?;
    let rest = &text.as_bytes()[end..];
    if rest.iter().any(|b| !is_ws(*b)) {
        return Err(JsonError::Syntax(format!("data after the JSON value at byte {end}")));
    }
    Ok(v)
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn syntax<T>(&self, what: &str) -> Result<T, JsonError> {
        let found = match self.peek() {
            None => "end of input".to_string(),
            Some(c) if c.is_ascii_graphic() => format!("'{}'", c as char),
            Some(c) => format!("byte 0x{c:02x}"),
        };
        Err(JsonError::Syntax(format!("expected {what} at byte {}, found {found}", self.i)))
    }

    fn value(&mut self) -> Result<Value, JsonError> {
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            // Start of a value.
            self.ws();
            let mut v = match self.peek() {
                Some(open @ (b'{' | b'[')) => {
                    // the new container's depth is stack.len() + 1 (SPEC 3.4 rule 2)
                    if stack.len() + 1 > MAX_DEPTH {
                        return Err(JsonError::TooDeep);
                    }
                    self.i += 1;
                    self.ws();
                    if open == b'{' {
                        if self.peek() == Some(b'}') {
                            self.i += 1;
                            Value::Obj(Vec::new())
                        } else {
                            let key = self.key()?;
                            stack.push(Frame::Obj(Vec::new(), HashSet::new(), key));
                            continue;
                        }
                    } else if self.peek() == Some(b']') {
                        self.i += 1;
                        Value::Arr(Vec::new())
                    } else {
                        stack.push(Frame::Arr(Vec::new()));
                        continue;
                    }
                }
                _ => self.scalar()?,
            };
            // A value is complete: attach it, closing containers as they end.
            loop {
                match stack.last_mut() {
                    None => return Ok(v),
                    Some(Frame::Arr(items)) => {
                        items.push(v);
                        self.ws();
                        match self.peek() {
                            Some(b',') => {
                                self.i += 1;
                                break;
                            }
                            Some(b']') => {
                                self.i += 1;
                                let Some(Frame::Arr(items)) = stack.pop() else { unreachable!() };
                                v = Value::Arr(items);
                            }
                            _ => return self.syntax("',' or ']'"),
                        }
                    }
                    Some(Frame::Obj(members, seen, key)) => {
                        let name = std::mem::take(key);
                        if !seen.insert(name.clone()) {
                            return Err(JsonError::Duplicate(name));
                        }
                        members.push((name, v));
                        self.ws();
                        match self.peek() {
                            Some(b',') => {
                                self.i += 1;
                                *key = self.key()?;
                                break;
                            }
                            Some(b'}') => {
                                self.i += 1;
                                let Some(Frame::Obj(members, _, _)) = stack.pop() else {
                                    unreachable!()
                                };
                                v = Value::Obj(members);
                            }
                            _ => return self.syntax("',' or '}'"),
                        }
                    }
                }
            }
        }
    }

    /// A member name and its ':'.
    fn key(&mut self) -> Result<String, JsonError> {
        self.ws();
        if self.peek() != Some(b'"') {
            return self.syntax("a member name");
        }
        let name = self.string()?;
        self.ws();
        if self.peek() != Some(b':') {
            return self.syntax("':'");
        }
        self.i += 1;
        Ok(name)
    }

    fn literal(&mut self, word: &str) -> bool {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn scalar(&mut self) -> Result<Value, JsonError> {
        match self.peek() {
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') if self.literal("true") => Ok(Value::Bool(true)),
            Some(b'f') if self.literal("false") => Ok(Value::Bool(false)),
            Some(b'n') if self.literal("null") => Ok(Value::Null),
            Some(b'N') if self.literal("NaN") => Err(JsonError::Nonfinite("NaN".into())),
            Some(b'I') if self.literal("Infinity") => {
                Err(JsonError::Nonfinite("Infinity".into()))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.syntax("a JSON value"),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
            if self.literal("Infinity") {
                return Err(JsonError::Nonfinite("-Infinity".into()));
            }
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.syntax("a digit"),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return self.syntax("a digit after '.'");
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return self.syntax("a digit in the exponent");
            }
        }
        let text = std::str::from_utf8(&self.b[start..self.i]).expect("ASCII");
        // Magnitude beyond binary64 (SPEC 3.3 rule 2); Rust's parser rounds correctly.
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Value::Num(text.to_string())),
            _ => Err(JsonError::Nonfinite(text.chars().take(40).collect())),
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return self.syntax("a hex digit"),
            };
            v = v * 16 + d as u32;
            self.i += 1;
        }
        Ok(v)
    }

    /// A string token; the input is valid UTF-8 already.
    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let start = self.i;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.extend_from_slice(&self.b[start..self.i]);
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(String::from_utf8(out).expect("valid UTF-8 input"));
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.i += 1;
                            let c = self.unicode_escape()?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => return self.syntax("a valid escape"),
                    };
                    self.i += 1;
                    out.push(c as u8);
                }
                None => return self.syntax("'\"' closing the string"),
                Some(_) => return self.syntax("no unescaped control character in a string"),
            }
        }
    }

    /// After `\u`: one code point, joining a surrogate pair; a lone surrogate is an encoding
    /// error (SPEC 3.2 rule 1).
    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let hi = self.hex4()?;
        if (0xDC00..0xE000).contains(&hi) {
            return Err(JsonError::Encoding(format!("lone surrogate \\u{hi:04x}")));
        }
        if (0xD800..0xDC00).contains(&hi) {
            if self.b[self.i..].starts_with(b"\\u") {
                self.i += 2;
                let lo = self.hex4()?;
                if (0xDC00..0xE000).contains(&lo) {
                    let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    return Ok(char::from_u32(cp).expect("valid pair"));
                }
            }
            return Err(JsonError::Encoding(format!("lone surrogate \\u{hi:04x}")));
        }
        Ok(char::from_u32(hi).expect("not a surrogate"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!(parse_document(" {\"a\": [1, 2.5, \"x\\u00e9\\ud83d\\ude00\"]} ").unwrap(),
                   Value::Obj(vec![("a".into(), Value::Arr(vec![
                       Value::Num("1".into()), Value::Num("2.5".into()),
                       Value::Str("x\u{e9}\u{1F600}".into())]))]));
        assert!(matches!(parse_document("{\"a\":1,\"a\":2}"), Err(JsonError::Duplicate(_))));
        assert!(matches!(parse_document("[NaN]"), Err(JsonError::Nonfinite(_))));
        assert!(matches!(parse_document("[-Infinity]"), Err(JsonError::Nonfinite(_))));
        assert!(matches!(parse_document("1e400"), Err(JsonError::Nonfinite(_))));
        assert!(matches!(parse_document("\"\\ud800\""), Err(JsonError::Encoding(_))));
        assert!(matches!(parse_document("[1,]"), Err(JsonError::Syntax(_))));
        assert!(matches!(parse_document("{} {}"), Err(JsonError::Syntax(_))));
        assert!(matches!(parse_document("01"), Err(JsonError::Syntax(_))));
        assert!(matches!(parse_document("\"a\tb\""), Err(JsonError::Syntax(_))));
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse_document(&deep(64)).is_ok());
        assert_eq!(parse_document(&deep(65)), Err(JsonError::TooDeep));
        assert_eq!(parse_document(&deep(100000)), Err(JsonError::TooDeep));
        assert_eq!(Value::Num("9223372036854775807".into()).int(), Int::Value(i64::MAX as u64));
        assert_eq!(Value::Num("4.0".into()).int(), Int::NotInteger);
        assert_eq!(Value::Num("99999999999999999999".into()).int(), Int::TooBig);
    }
}
