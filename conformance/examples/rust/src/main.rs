//! shardspec-reader: a conformance adapter written from SPEC.md alone.
//!
//! `shardspec-reader CHECKPOINT_DIR RANK OUTPUT_FILE` loads rank RANK (SPEC 11.1, checksums
//! always verified) and writes its tensors to OUTPUT_FILE as a plain safetensors file
//! (conformance/README.md, "The adapter protocol"). On an error it writes nothing, prints
//! `error [code] message (SPEC x.y)` on stderr and exits 1.

mod blake2b;
mod checks;
mod dtype;
mod error;
mod joins;
mod json;
mod model;
mod paths;
mod reader;
mod safetensors;
mod schema;
mod sha256;
mod ties;
mod version;

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() != 4 {
        eprintln!("usage: shardspec-reader CHECKPOINT_DIR RANK OUTPUT_FILE");
        return ExitCode::from(2);
    }
    // must-understand extensions the user allows ignoring (SPEC 4.4 rule 3)
    let ignore: Vec<String> = std::env::var("SHARDSPEC_IGNORE_EXTENSIONS").unwrap_or_default()
        .split(',').map(|s| s.trim_matches([' ', '\t']).to_string()).filter(|s| !s.is_empty())
        .collect();
    let mut warnings = Vec::new();
    let result = reader::load_rank(Path::new(&args[1]), &args[2].to_string_lossy(), &ignore,
                                   &mut warnings);
    for w in &warnings {
        eprintln!("warning {w}");
    }
    let rank = match result {
        Ok(rank) => rank,
        Err(e) => {
            eprintln!("error {e}");
            return ExitCode::from(1);
        }
    };
    let out: Vec<safetensors::OutTensor> = rank.tensors.iter().map(|t| safetensors::OutTensor {
        name: &t.name,
        dtype: &t.dtype,
        shape: &t.shape,
        bytes: &rank.data[t.file][t.begin..t.end],
    }).collect();
    if let Err(e) = safetensors::write_file(Path::new(&args[3]), &out) {
        eprintln!("error [output] cannot write {}: {e}", Path::new(&args[3]).display());
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
