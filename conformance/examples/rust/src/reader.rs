//! The reader procedure of SPEC 11.1: every check of steps 1–11 before anything is returned.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::path::Path;

use crate::error::{Finding, Result};
use crate::fail;
use crate::json::{self, JsonError};
use crate::model::{Manifest, TensorKind};
use crate::safetensors::{self, Entry};
use crate::blake2b::blake2b_hex;
use crate::sha256::Sha256;
use crate::{checks, joins, paths, schema, ties, version};

/// MAX_MANIFEST_BYTES (SPEC 3.4 rule 1, 12).
pub const MAX_MANIFEST_BYTES: u64 = 268_435_456;

/// A loaded tensor: its bytes are `data[file][begin..end]` (for a join, `file` is a buffer
/// of its own).
pub struct Loaded {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub file: usize,
    pub begin: usize,
    pub end: usize,
}

/// What a rank loads: the data files' bytes (and the joins' buffers) and the tensors in them,
/// aliases included.
pub struct Rank {
    pub data: Vec<Vec<u8>>,
    pub tensors: Vec<Loaded>,
}

/// Steps 1–3: find, size-check, decode and parse the manifest.
fn read_manifest(dir: &Path) -> Result<(std::path::PathBuf, json::Value)> {
    // step 1 (SPEC 2.3): no manifest, no checkpoint; nothing else is read
    match fs::symlink_metadata(dir.join("shardspec.json")) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(20) => {
            fail!("not-committed", "{} has no shardspec.json", dir.display())
        }
        Err(e) => fail!("not-committed", "cannot examine {}/shardspec.json: {e}", dir.display()),
    }
    let base = match paths::checkpoint_dir(dir) {
        Ok(b) => b,
        Err(e) => fail!("not-committed", "cannot resolve {}: {e}", dir.display()),
    };
    let (file, size) = paths::open_listed(&base, "shardspec.json")?;
    // step 2 (SPEC 3.4 rule 1): compare the size before reading
    if size > MAX_MANIFEST_BYTES {
        fail!("json-too-large", "the manifest has {size} bytes, over {MAX_MANIFEST_BYTES}");
    }
    let mut bytes = Vec::with_capacity(size as usize);
    if let Err(e) = file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes) {
        fail!("file-missing", "cannot read the manifest: {e}");
    }
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        fail!("json-too-large", "the manifest grew past {MAX_MANIFEST_BYTES} bytes");
    }
    // step 3 (SPEC 3.2–3.4)
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        fail!("json-encoding", "the manifest starts with a byte order mark");
    }
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => t,
        Err(e) => fail!("json-encoding", "the manifest is not UTF-8: {e}"),
    };
    let root = match json::parse_document(text) {
        Ok(v) => v,
        Err(JsonError::Syntax(m)) => fail!("json-syntax", "{m}"),
        Err(JsonError::Encoding(m)) => fail!("json-encoding", "{m}"),
        Err(JsonError::Duplicate(n)) => {
            fail!("json-duplicate-name", "an object has the member {n:?} twice")
        }
        Err(JsonError::Nonfinite(m)) => fail!("json-nonfinite", "non-finite number {m}"),
        Err(JsonError::TooDeep) => {
            fail!("json-too-deep", "the manifest nests deeper than {}", json::MAX_DEPTH)
        }
    };
    Ok((base, root))
}

/// Step 6 (SPEC 4.4): this reader understands no extension.
fn check_extensions(m: &Manifest, ignore: &[String], warnings: &mut Vec<Finding>) -> Result<()> {
    for ext in &m.extensions {
        if ext.must_understand && !ignore.iter().any(|n| *n == ext.name) {
            fail!("extension-unsupported", "must-understand extension {:?} is not supported",
                  ext.name);
        }
        let why = if ext.must_understand { "ignored as the user asked" } else { "optional" };
        warnings.push(Finding::new("extension-ignored",
                                   format!("extension {:?} ({why}) ignored", ext.name)));
    }
    Ok(())
}

/// Load rank `rank` of the checkpoint in `dir` (SPEC 11.1), verifying every checksum.
pub fn load_rank(dir: &Path, rank: &str, ignore: &[String], warnings: &mut Vec<Finding>)
                 -> Result<Rank> {
    let (base, root) = read_manifest(dir)?;
    // step 4 (SPEC 4.2)
    let newer_minor = version::check_version(&root, warnings)?;
    // step 5 (SPEC 3.5, 4.3)
    let m = schema::validate(&root, newer_minor, warnings)?;
    drop(root);
    // step 6
    check_extensions(&m, ignore, warnings)?;
    // step 7
    checks::check_manifest(&m)?;
    ties::check_ties(&m)?;
    // step 8
    let r = match rank.parse::<u64>() {
        Ok(r) if rank.bytes().all(|b| b.is_ascii_digit()) && r < m.layout.world_size => r,
        _ => fail!("rank-out-of-range", "rank {rank:?} is not in 0..{}", m.layout.world_size),
    };
    // the pieces of rank r by file: path -> [(tensor index, piece index)]
    let mut by_file: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
    for (ti, t) in m.tensors.iter().enumerate() {
        for (pi, p) in t.pieces.iter().enumerate() {
            if p.rank == r {
                by_file.entry(p.file.as_str()).or_default().push((ti, pi));
            }
        }
    }
    // step 9, part by part
    let mut data = Vec::new();
    // tensor index -> its pieces on rank r as (piece index, file index, begin, end)
    let mut arrays: HashMap<usize, Vec<(usize, usize, usize, usize)>> = HashMap::new();
    for (fi, rec) in m.ranks[r as usize].files.iter().enumerate() {
        let rel = rec.path.as_str();
        // (a) SPEC 2.2 rules 5–7
        let (file, size) = paths::open_listed(&base, rel)?;
        // (b) SPEC 9.1
        if size != rec.size {
            fail!("file-size", "{rel:?} has {size} bytes, the manifest says {}", rec.size);
        }
        let mut bytes = Vec::with_capacity(size as usize);
        if let Err(e) = file.take(size).read_to_end(&mut bytes) {
            fail!("file-size", "{rel:?} cannot be read: {e}");
        }
        if bytes.len() as u64 != size {
            fail!("file-size", "{rel:?} changed size while read");
        }
        // (c) SPEC 6.3, 6.4
        let n = safetensors::header_length(&bytes, size, rel)?;
        let start = 8 + n as usize;
        let entries = safetensors::parse_header(&bytes[8..start], size - 8 - n, rel)?;
        // (d) SPEC 7.2 rule 5
        let entry_of: HashMap<&str, &Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
        let pieces = by_file.get(rel).map(Vec::as_slice).unwrap_or(&[]);
        for &(ti, pi) in pieces {
            let t = &m.tensors[ti];
            let p = &t.pieces[pi];
            let Some(e) = entry_of.get(t.name.as_str()) else {
                fail!("st-missing-tensor", "{rel:?} has no entry for tensor {:?}", t.name);
            };
            if e.dtype != t.dtype || e.shape != p.shape {
                fail!("st-mismatch", "{rel:?}: entry {:?} is {} {:?}, the manifest says {} {:?}",
                      t.name, e.dtype, e.shape, t.dtype, p.shape);
            }
        }
        for e in &entries {
            if !pieces.iter().any(|&(ti, _)| m.tensors[ti].name == e.name) {
                fail!("st-extra-tensor", "{rel:?} holds {:?}, which the manifest places in no \
                       piece of this file", e.name);
            }
        }
        // (f) SPEC 9.2: every known algorithm the record lists (sha256 and blake2b)
        for (algorithm, want) in &rec.checksums {
            let got = match algorithm.as_str() {
                "sha256" => {
                    let mut h = Sha256::new();
                    h.update(&bytes);
                    h.hex()
                }
                "blake2b" => blake2b_hex(&bytes),
                _ => continue,
            };
            if got != *want {
                fail!("checksum-mismatch", "{rel:?}: {algorithm} is {got}, the manifest says \
                       {want}");
            }
        }
        // (e) each piece's array is its entry's bytes
        for &(ti, pi) in pieces {
            let e = entry_of[m.tensors[ti].name.as_str()];
            arrays.entry(ti).or_default()
                .push((pi, fi, start + e.begin as usize, start + e.end as usize));
        }
        data.push(bytes);
    }
    // step 10 (SPEC 7.2 rules 6, 7): a tensor's value is its piece, or the join of its pieces
    let mut loaded = Vec::new();
    let mut holder: HashMap<&str, usize> = HashMap::new(); // tensor name -> loaded index
    let mut held: Vec<_> = arrays.into_iter().collect();
    held.sort_unstable_by_key(|(ti, _)| *ti);
    for (ti, parts) in held {
        let t = &m.tensors[ti];
        holder.insert(t.name.as_str(), loaded.len());
        if let [(pi, fi, begin, end)] = parts[..] {
            loaded.push(Loaded { name: t.name.clone(), dtype: t.dtype.clone(),
                                 shape: t.pieces[pi].shape.clone(), file: fi, begin, end });
            continue;
        }
        let pieces: Vec<(&[u64], &[u64], &[u8])> = parts.iter()
            .map(|&(pi, fi, begin, end)| {
                let p = &t.pieces[pi];
                (p.offset.as_deref().unwrap(), p.shape.as_slice(), &data[fi][begin..end])
            })
            .collect();
        let (shape, bytes) = joins::join(&pieces);
        loaded.push(Loaded { name: t.name.clone(), dtype: t.dtype.clone(), shape,
                             file: data.len(), begin: 0, end: bytes.len() });
        data.push(bytes);
    }
    // step 11 (SPEC 7.6 rule 3): an alias where its target has a piece on rank r
    for t in &m.tensors {
        if let TensorKind::Alias { target } = &t.kind {
            if let Some(&i) = holder.get(target.as_str()) {
                let l = &loaded[i];
                let alias = Loaded { name: t.name.clone(), dtype: l.dtype.clone(),
                                     shape: l.shape.clone(), file: l.file, begin: l.begin,
                                     end: l.end };
                loaded.push(alias);
            }
        }
    }
    Ok(Rank { data, tensors: loaded })
}
