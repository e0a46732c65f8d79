//! Opening a listed file safely (SPEC 2.2 rules 5–7): resolve it against the checkpoint
//! directory following symbolic links, refuse what lies outside, what is missing and what is
//! not a regular file, and open it so that nothing can block or redirect the open.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use crate::error::Result;
use crate::fail;

#[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
const O_NONBLOCK: i32 = 0x0004;
#[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
const O_NOFOLLOW: i32 = 0x0100;
#[cfg(all(target_os = "linux", any(target_arch = "aarch64", target_arch = "arm")))]
const O_NOFOLLOW: i32 = 0o100000;
#[cfg(all(target_os = "linux", not(any(target_arch = "aarch64", target_arch = "arm"))))]
const O_NOFOLLOW: i32 = 0o400000;
#[cfg(target_os = "linux")]
const O_NONBLOCK: i32 = 0o4000;

/// Where `rel` leads from `base` (already canonical), following symbolic links as far as
/// they exist, like `realpath` in non-strict mode: a missing component and all after it are
/// taken literally.
fn resolve(base: &Path, rel: &str) -> PathBuf {
    let mut resolved = base.to_path_buf();
    let mut pending: VecDeque<String> = rel.split('/').map(str::to_string).collect();
    let mut links = 0;
    let mut missing = false;
    while let Some(part) = pending.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let candidate = resolved.join(&part);
        if missing {
            resolved = candidate;
            continue;
        }
        match fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() && links < 40 => {
                links += 1;
                let target = match fs::read_link(&candidate) {
                    Ok(t) => t,
                    Err(_) => {
                        resolved = candidate;
                        missing = true;
                        continue;
                    }
                };
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                let mut parts: Vec<String> = Vec::new();
                for c in target.components() {
                    match c {
                        Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                        Component::ParentDir => parts.push("..".into()),
                        _ => {}
                    }
                }
                for p in parts.into_iter().rev() {
                    pending.push_front(p);
                }
            }
            Ok(_) => resolved = candidate,
            Err(_) => {
                resolved = candidate;
                missing = true;
            }
        }
    }
    resolved
}

/// The canonical checkpoint directory.
pub fn checkpoint_dir(dir: &Path) -> io::Result<PathBuf> {
    fs::canonicalize(dir)
}

/// Open listed path `rel` of the checkpoint at canonical `base` (SPEC 2.2 rules 5–7).
/// Returns the open file and its size, taken from the opened file.
pub fn open_listed(base: &Path, rel: &str) -> Result<(File, u64)> {
    let resolved = resolve(base, rel);
    // rule 5: inside the resolved checkpoint directory (component-wise prefix)
    if !resolved.starts_with(base) {
        fail!("path-escapes", "{rel:?} resolves to {}, outside the checkpoint directory",
              resolved.display());
    }
    // rules 6–7, checked before opening, so a FIFO or device is never opened
    let meta = match fs::symlink_metadata(&resolved) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(20) => {
            fail!("file-missing", "{rel:?} does not exist")
        }
        Err(e) => fail!("file-missing", "{rel:?} cannot be examined: {e}"),
    };
    if meta.file_type().is_symlink() {
        // still a link after 40 of them: a loop, which reaches nothing (SPEC 2.2 rule 6)
        fail!("file-missing", "{rel:?}: a loop of symbolic links reaches no file");
    }
    if !meta.is_file() {
        fail!("file-not-regular", "{rel:?} is not a regular file");
    }
    // no link and no blocking, whatever was swapped in since (SPEC 2.2, informative)
    let file = match OpenOptions::new().read(true).custom_flags(O_NOFOLLOW | O_NONBLOCK)
        .open(&resolved) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => fail!("file-missing", "{rel:?} vanished"),
        Err(e) => fail!("file-missing", "{rel:?} cannot be opened: {e}"),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => fail!("file-missing", "{rel:?} cannot be examined: {e}"),
    };
    if !meta.is_file() {
        fail!("file-not-regular", "{rel:?} is not a regular file");
    }
    Ok((file, meta.len()))
}
