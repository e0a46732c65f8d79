//! The JSON Schema of SPEC 3.5 (schema/manifest.schema.json), checked by hand, building the
//! typed manifest. Unknown fields of a newer minor version are warnings (SPEC 4.3).

use crate::dtype::{self, MAX_SIZE};
use crate::error::{Finding, Result};
use crate::fail;
use crate::json::{Int, Value};
use crate::model::*;
use crate::version::parse_version;

type Members = [(String, Value)];

struct Schema<'w> {
    /// a newer minor version: unknown fields are ignored with a warning (SPEC 4.3 rule 3)
    newer_minor: bool,
    warnings: &'w mut Vec<Finding>,
}

/// MAX_NAME_BYTES and MAX_PATH_BYTES (SPEC 12).
pub const MAX_NAME_BYTES: usize = 1024;
pub const MAX_PATH_BYTES: usize = 1024;

fn get<'v>(members: &'v Members, name: &str) -> Option<&'v Value> {
    members.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// `^[a-z0-9][a-z0-9<extra>]{0,max_rest}$`, ECMA-262 semantics (`$` is the end of input).
fn name_pattern(s: &str, extra: &[u8], max_rest: usize) -> bool {
    let b = s.as_bytes();
    let first = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && first(b[0])
        && b.len() - 1 <= max_rest
        && b[1..].iter().all(|c| first(*c) || extra.contains(c))
}

fn hex_pattern(s: &str, min: usize, max: usize) -> bool {
    (min..=max).contains(&s.len()) && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// The `path` definition: 1..1024 characters, rules 2–4 of SPEC 2.2.
pub fn path_pattern(s: &str) -> bool {
    let chars = s.chars().count();
    (1..=1024).contains(&chars)
        && !s.contains(['\\', '\0'])
        && s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

impl<'w> Schema<'w> {
    /// An object whose members the schema lists: check unknown and required members.
    fn record<'v>(&mut self, v: &'v Value, at: &str, allowed: &[&str], required: &[&str])
                  -> Result<&'v Members> {
        let members = self.object(v, at)?;
        for (name, _) in members {
            if !allowed.contains(&name.as_str()) {
                if self.newer_minor {
                    self.warnings.push(Finding::new("unknown-field", format!(
                        "{at}: unknown field {name:?} of a newer minor version ignored")));
                } else {
                    fail!("schema", "{at}: unknown field {name:?}");
                }
            }
        }
        for name in required {
            if get(members, name).is_none() {
                fail!("schema", "{at}: missing required member {name:?}");
            }
        }
        Ok(members)
    }

    fn object<'v>(&self, v: &'v Value, at: &str) -> Result<&'v Members> {
        match v {
            Value::Obj(m) => Ok(m),
            other => fail!("schema", "{at}: expected an object, found {}", other.kind()),
        }
    }

    fn array<'v>(&self, v: &'v Value, at: &str, min: usize, max: usize) -> Result<&'v [Value]> {
        match v {
            Value::Arr(items) if items.len() < min => {
                fail!("schema", "{at}: needs at least {min} item(s)")
            }
            Value::Arr(items) if items.len() > max => {
                fail!("schema", "{at}: has more than {max} items")
            }
            Value::Arr(items) => Ok(items),
            other => fail!("schema", "{at}: expected an array, found {}", other.kind()),
        }
    }

    fn string<'v>(&self, v: &'v Value, at: &str) -> Result<&'v str> {
        match v {
            Value::Str(s) => Ok(s),
            other => fail!("schema", "{at}: expected a string, found {}", other.kind()),
        }
    }

    /// An integer written as an integer token (SPEC 3.3 rule 3) in `min..=max`.
    fn int(&self, v: &Value, at: &str, min: u64, max: u64) -> Result<u64> {
        match v.int() {
            Int::Value(n) if n >= min && n <= max => Ok(n),
            Int::Value(_) | Int::Negative | Int::TooBig if matches!(v, Value::Num(_)) => {
                fail!("schema", "{at}: integer out of range {min}..{max}")
            }
            _ if matches!(v, Value::Num(_)) => {
                fail!("schema", "{at}: expected an integer token (no fraction, no exponent)")
            }
            _ => fail!("schema", "{at}: expected an integer, found {}", v.kind()),
        }
    }

    fn shape(&self, v: &Value, at: &str) -> Result<Vec<u64>> {
        let items = self.array(v, at, 0, 64)?;
        items.iter().enumerate().map(|(i, d)| self.int(d, &format!("{at}[{i}]"), 0, MAX_SIZE))
            .collect()
    }

    fn dtype(&self, v: &Value, at: &str) -> Result<String> {
        let s = self.string(v, at)?;
        if dtype::bits(s).is_none() {
            fail!("schema", "{at}: unknown dtype {s:?} (SPEC 6.4)");
        }
        Ok(s.to_string())
    }

    fn path(&self, v: &Value, at: &str) -> Result<String> {
        let s = self.string(v, at)?;
        if !path_pattern(s) {
            fail!("schema", "{at}: path {s:?} is not a safe relative path (SPEC 2.2)");
        }
        Ok(s.to_string())
    }

    /// `tensor_name`: non-empty, not `__metadata__`, at most 1024 characters; the byte
    /// limit of SPEC 7.1 rule 2 is also error `schema`.
    fn tensor_name(&self, s: &str, at: &str) -> Result<()> {
        if s.is_empty() || s == "__metadata__" {
            fail!("schema", "{at}: tensor name {s:?} is not allowed (SPEC 7.1)");
        }
        if s.len() > MAX_NAME_BYTES {
            fail!("schema", "{at}: tensor name has {} UTF-8 bytes, over {MAX_NAME_BYTES} \
                   (SPEC 7.1)", s.len());
        }
        Ok(())
    }

    fn file(&mut self, v: &Value, at: &str) -> Result<FileRecord> {
        let m = self.record(v, at, &["path", "size", "checksums"], &["path", "size", "checksums"])?;
        let path = self.path(get(m, "path").unwrap(), &format!("{at}.path"))?;
        let size = self.int(get(m, "size").unwrap(), &format!("{at}.size"), 0, MAX_SIZE)?;
        let at_c = format!("{at}.checksums");
        let sums = self.object(get(m, "checksums").unwrap(), &at_c)?;
        let mut checksums = Vec::new();
        for (name, value) in sums {
            if !name_pattern(name, b"_-", 31) {
                fail!("schema", "{at_c}: bad algorithm name {name:?}");
            }
            let digest = self.string(value, &format!("{at_c}.{name}"))?;
            let ok = match name.as_str() {
                "sha256" => hex_pattern(digest, 64, 64),
                "blake2b" => hex_pattern(digest, 128, 128),
                _ => hex_pattern(digest, 8, 256),
            };
            if !ok {
                fail!("schema", "{at_c}.{name}: not a lowercase hex digest of the right length");
            }
            checksums.push((name.clone(), digest.to_string()));
        }
        if get(sums, "sha256").is_none() {
            fail!("schema", "{at_c}: sha256 is required (SPEC 9.2)");
        }
        Ok(FileRecord { path, size, checksums })
    }

    fn files(&mut self, v: &Value, at: &str) -> Result<Vec<FileRecord>> {
        let items = self.array(v, at, 0, usize::MAX)?;
        items.iter().enumerate().map(|(i, f)| self.file(f, &format!("{at}[{i}]"))).collect()
    }

    fn layout(&mut self, v: &Value) -> Result<Layout> {
        const ALL: [&str; 5] = ["tp_size", "pp_size", "ep_size", "world_size", "rank_order"];
        let m = self.record(v, "layout", &ALL, &ALL)?;
        let size = |s: &Self, n: &str| s.int(get(m, n).unwrap(), &format!("layout.{n}"), 1, 65536);
        let order = self.string(get(m, "rank_order").unwrap(), "layout.rank_order")?;
        const ORDERS: [&str; 6] = ["pp-ep-tp", "pp-tp-ep", "ep-pp-tp", "ep-tp-pp", "tp-pp-ep",
                                   "tp-ep-pp"];
        let layout = Layout {
            tp_size: size(self, "tp_size")?,
            pp_size: size(self, "pp_size")?,
            ep_size: size(self, "ep_size")?,
            world_size: size(self, "world_size")?,
            rank_order: order.to_string(),
        };
        if !ORDERS.contains(&order) {
            fail!("schema", "layout.rank_order: unknown rank order {order:?} (SPEC 5.2)");
        }
        Ok(layout)
    }

    fn rank(&mut self, v: &Value, at: &str) -> Result<RankRecord> {
        const ALL: [&str; 5] = ["rank", "tp_rank", "pp_rank", "ep_rank", "files"];
        let m = self.record(v, at, &ALL, &ALL)?;
        let int = |s: &Self, n: &str| s.int(get(m, n).unwrap(), &format!("{at}.{n}"), 0, 65535);
        Ok(RankRecord {
            rank: int(self, "rank")?,
            tp_rank: int(self, "tp_rank")?,
            pp_rank: int(self, "pp_rank")?,
            ep_rank: int(self, "ep_rank")?,
            files: self.files(get(m, "files").unwrap(), &format!("{at}.files"))?,
        })
    }

    fn logical(&mut self, v: &Value, at: &str) -> Result<Logical> {
        let m = self.record(v, at, &["dtype", "shape"], &["dtype", "shape"])?;
        Ok(Logical {
            dtype: self.dtype(get(m, "dtype").unwrap(), &format!("{at}.dtype"))?,
            shape: self.shape(get(m, "shape").unwrap(), &format!("{at}.shape"))?,
        })
    }

    fn tie(&mut self, v: &Value, at: &str) -> Result<Tie> {
        let m = self.record(v, at, &["tensor", "axes", "block"], &["tensor"])?;
        let tensor = self.string(get(m, "tensor").unwrap(), &format!("{at}.tensor"))?;
        self.tensor_name(tensor, &format!("{at}.tensor"))?;
        let list = |s: &Self, name: &str, min: u64, max: u64| -> Result<Option<Vec<u64>>> {
            let Some(v) = get(m, name) else { return Ok(None) };
            let at = format!("{at}.{name}");
            let items = s.array(v, &at, 1, 64)?;
            items.iter().enumerate().map(|(i, x)| s.int(x, &format!("{at}[{i}]"), min, max))
                .collect::<Result<Vec<_>>>().map(Some)
        };
        let axes = list(self, "axes", 0, 63)?;
        let block = list(self, "block", 1, MAX_SIZE)?;
        if axes.is_some() && block.is_none() {
            fail!("schema", "{at}: axes without block (SPEC 8.4 rule 1)");
        }
        Ok(Tie { tensor: tensor.to_string(), block, axes })
    }

    fn pieces(&mut self, v: &Value, at: &str, global: bool) -> Result<Vec<Piece>> {
        let items = self.array(v, at, 1, usize::MAX)?;
        let mut pieces = Vec::with_capacity(items.len());
        for (i, p) in items.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let m = if global {
                self.record(p, &at, &["rank", "file", "offset", "shape", "replica"],
                            &["rank", "file", "offset", "shape"])?
            } else {
                self.record(p, &at, &["rank", "file", "shape"], &["rank", "file", "shape"])?
            };
            let rank = self.int(get(m, "rank").unwrap(), &format!("{at}.rank"), 0, 65535)?;
            let file = self.path(get(m, "file").unwrap(), &format!("{at}.file"))?;
            let shape = self.shape(get(m, "shape").unwrap(), &format!("{at}.shape"))?;
            let mut offset = None;
            let mut replica = 0;
            if global {
                offset = Some(self.shape(get(m, "offset").unwrap(), &format!("{at}.offset"))?);
                if let Some(r) = get(m, "replica") {
                    replica = self.int(r, &format!("{at}.replica"), 0, 65535)?;
                }
            }
            pieces.push(Piece { rank, file, offset, shape, replica });
        }
        Ok(pieces)
    }

    /// A tensor record; its kind is decided by SPEC 4.3 rule 2, as the schema's `tensor`
    /// decides it (`if`/`then`/`else` on the members present).
    fn tensor(&mut self, name: &str, v: &Value) -> Result<Tensor> {
        let at = format!("tensors[{name:?}]");
        let members = self.object(v, &at)?;
        if get(members, "alias_of").is_some() {
            let m = self.record(v, &at, &["alias_of"], &["alias_of"])?;
            let target = self.string(get(m, "alias_of").unwrap(), &format!("{at}.alias_of"))?;
            self.tensor_name(target, &format!("{at}.alias_of"))?;
            return Ok(Tensor { name: name.to_string(), kind: TensorKind::Alias {
                target: target.to_string() }, dtype: String::new(), pieces: Vec::new(),
                logical: None });
        }
        let local = get(members, "rank_local").is_some();
        let m = if local {
            self.record(v, &at, &["dtype", "rank_local", "logical", "pieces"],
                        &["dtype", "rank_local", "pieces"])?
        } else {
            self.record(v, &at, &["dtype", "shape", "logical", "tied_to", "pieces"],
                        &["dtype", "shape", "pieces"])?
        };
        let dtype = self.dtype(get(m, "dtype").unwrap(), &format!("{at}.dtype"))?;
        let logical = match get(m, "logical") {
            Some(l) => Some(self.logical(l, &format!("{at}.logical"))?),
            None => None,
        };
        let kind = if local {
            if get(m, "rank_local") != Some(&Value::Bool(true)) {
                fail!("schema", "{at}.rank_local: must be true");
            }
            TensorKind::RankLocal
        } else {
            let shape = self.shape(get(m, "shape").unwrap(), &format!("{at}.shape"))?;
            let tied_to = match get(m, "tied_to") {
                Some(t) => Some(self.tie(t, &format!("{at}.tied_to"))?),
                None => None,
            };
            TensorKind::Global { shape, tied_to }
        };
        let pieces = self.pieces(get(m, "pieces").unwrap(), &format!("{at}.pieces"), !local)?;
        Ok(Tensor { name: name.to_string(), kind, dtype, pieces, logical })
    }
}

/// Validate the parsed manifest (SPEC 11.1 step 5) and build the typed records.
pub fn validate(root: &Value, newer_minor: bool, warnings: &mut Vec<Finding>) -> Result<Manifest> {
    let mut s = Schema { newer_minor, warnings };
    if !matches!(root, Value::Obj(_)) {
        fail!("schema", "the manifest is {}, not an object (SPEC 3.2 rule 3)", root.kind());
    }
    const TOP: [&str; 10] = ["format", "format_version", "generator", "layout", "ranks",
                             "quantization", "tensors", "extra_files", "metadata", "extensions"];
    let m = s.record(root, "manifest", &TOP,
                     &["format", "format_version", "layout", "ranks", "quantization", "tensors"])?;
    // the magic (SPEC 3.1)
    if get(m, "format") != Some(&Value::Str("shardspec".into())) {
        fail!("schema", "format: must be the string \"shardspec\" (SPEC 3.1)");
    }
    let version = s.string(get(m, "format_version").unwrap(), "format_version")?;
    let Some((_, minor)) = parse_version(version) else {
        fail!("schema", "format_version {version:?} is not MAJOR.MINOR (SPEC 4.1)");
    };
    if let Some(g) = get(m, "generator") {
        if s.string(g, "generator")?.chars().count() > 256 {
            fail!("schema", "generator: more than 256 characters");
        }
    }
    let layout = s.layout(get(m, "layout").unwrap())?;
    let rank_items = s.array(get(m, "ranks").unwrap(), "ranks", 1, usize::MAX)?;
    let mut ranks = Vec::with_capacity(rank_items.len());
    for (i, r) in rank_items.iter().enumerate() {
        ranks.push(s.rank(r, &format!("ranks[{i}]"))?);
    }
    let q = s.record(get(m, "quantization").unwrap(), "quantization", &["method", "config"],
                     &["method"])?;
    let method = s.string(get(q, "method").unwrap(), "quantization.method")?;
    if !name_pattern(method, b"_.-", 63) {
        fail!("schema", "quantization.method {method:?} does not match the pattern (SPEC 8.1)");
    }
    if let Some(c) = get(q, "config") {
        s.object(c, "quantization.config")?;
    }
    let mut tensors = Vec::new();
    for (name, record) in s.object(get(m, "tensors").unwrap(), "tensors")? {
        s.tensor_name(name, "tensors")?;
        tensors.push(s.tensor(name, record)?);
    }
    let extra_files = match get(m, "extra_files") {
        Some(v) => s.files(v, "extra_files")?,
        None => Vec::new(),
    };
    if let Some(meta) = get(m, "metadata") {
        for (k, v) in s.object(meta, "metadata")? {
            s.string(v, &format!("metadata[{k:?}]"))?;
        }
    }
    let mut extensions = Vec::new();
    if let Some(ext) = get(m, "extensions") {
        for (name, record) in s.object(ext, "extensions")? {
            let at = format!("extensions[{name:?}]");
            if !name_pattern(name, b"_.-", 127) {
                fail!("schema", "{at}: extension name does not match the pattern (SPEC 4.4)");
            }
            let r = s.object(record, &at)?;
            let must_understand = match get(r, "must_understand") {
                Some(Value::Bool(b)) => *b,
                Some(other) => fail!("schema", "{at}.must_understand: expected a boolean, found \
                                      {}", other.kind()),
                None => fail!("schema", "{at}: missing required member \"must_understand\""),
            };
            extensions.push(Extension { name: name.clone(), must_understand });
        }
    }
    Ok(Manifest { minor, layout, ranks, quantization_method: method.to_string(), tensors, extra_files,
                  extensions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert!(path_pattern("a/b.safetensors"));
        for bad in ["", "/a", "a/", "a//b", "./a", "a/..", "a\\b", "a\0b", "."] {
            assert!(!path_pattern(bad), "{bad:?}");
        }
        assert!(path_pattern("...") && path_pattern(".a"));
        assert!(name_pattern("org.example_x-1", b"_.-", 127));
        assert!(!name_pattern("Org", b"_.-", 127) && !name_pattern("_a", b"_.-", 127));
        assert!(!name_pattern("abc\n", b"_.-", 127));
        assert!(hex_pattern(&"a".repeat(64), 64, 64) && !hex_pattern(&"A".repeat(64), 64, 64));
    }
}
