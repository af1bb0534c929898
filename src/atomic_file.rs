//! Crash-safe file replacement: write a temp file in the same directory, fsync it, rename it over
//! the target, fsync the directory. Readers see the old file or the new one, never a mix, and a
//! process killed mid-write leaves only a hidden temp file behind.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temp files of concurrent writes within one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The hidden temp path used while writing `path`: `.<name>.tmp.<pid>.<n>` in the same dir.
fn temp_path_for(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp.{}.{n}", std::process::id()))
}

/// True for names [`write_atomically`] uses for its temp files.
pub fn is_temp_file_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp.")
}

/// Fsyncs a directory, making a rename inside it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `path` with `bytes` atomically and durably (see the module doc). On error the temp
/// file is removed and `path` is untouched.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let temp = temp_path_for(path);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, path)?;
        sync_dir(&dir)
    })();
    if result.is_err() {
        // Best effort: the temp file may not exist (open failed) or may already be renamed.
        let _ = std::fs::remove_file(&temp);
    }
    result
}
