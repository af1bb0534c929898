//! The IDX file format (MNIST's): a big-endian header (magic, dimensions) followed by raw
//! unsigned bytes, optionally gzip-compressed. Every error names the path, the byte offset and
//! what was expected there.

use super::DataError;
use flate2::bufread::GzDecoder;
use std::io::Read;
use std::path::Path;

/// Magic number of IDX unsigned-byte 3-D data (images).
pub const IDX_IMAGES_MAGIC: u32 = 2051;
/// Magic number of IDX unsigned-byte 1-D data (labels).
pub const IDX_LABELS_MAGIC: u32 = 2049;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The contents of an IDX image file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxImages {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    /// `count × rows × cols` pixels, row-major.
    pub pixels: Vec<u8>,
}

/// Reads a file whole; a missing or unreadable file is an error naming the path.
pub fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and parses an IDX image file (raw or gzip).
pub fn read_idx_images(path: &Path) -> Result<IdxImages, DataError> {
    parse_idx_images(&path.display().to_string(), &read_file(path)?)
}

/// Reads and parses an IDX label file (raw or gzip).
pub fn read_idx_labels(path: &Path) -> Result<Vec<u8>, DataError> {
    parse_idx_labels(&path.display().to_string(), &read_file(path)?)
}

/// Parses the bytes of an IDX image file (magic 2051), gunzipping them first when they start
/// with the gzip magic. `name` is used in errors.
pub fn parse_idx_images(name: &str, file: &[u8]) -> Result<IdxImages, DataError> {
    let stream = IdxStream::open(name, file)?;
    stream.expect_magic(IDX_IMAGES_MAGIC, "IDX unsigned-byte 3-D images")?;
    let count = stream.u32_at(4, "image count")? as usize;
    let rows = stream.u32_at(8, "row count")? as usize;
    let cols = stream.u32_at(12, "column count")? as usize;
    let size = count
        .checked_mul(rows)
        .and_then(|n| n.checked_mul(cols))
        .ok_or_else(|| stream.error(4, format!("{count} images of {rows}x{cols} overflow")))?;
    let what = format!("image data ({count} images of {rows}x{cols})");
    let pixels = stream.exact_rest(16, size, &what)?.to_vec();
    Ok(IdxImages {
        count,
        rows,
        cols,
        pixels,
    })
}

/// Parses the bytes of an IDX label file (magic 2049), raw or gzip.
pub fn parse_idx_labels(name: &str, file: &[u8]) -> Result<Vec<u8>, DataError> {
    let stream = IdxStream::open(name, file)?;
    stream.expect_magic(IDX_LABELS_MAGIC, "IDX unsigned-byte 1-D labels")?;
    let count = stream.u32_at(4, "label count")? as usize;
    let what = format!("label data ({count} labels)");
    Ok(stream.exact_rest(8, count, &what)?.to_vec())
}

/// Offset of label `i` in an IDX label stream (for errors about label values).
pub fn idx_label_offset(i: usize) -> u64 {
    8 + i as u64
}

/// The (decompressed) bytes of an IDX file, with what errors need to name it.
struct IdxStream<'a> {
    name: &'a str,
    bytes: std::borrow::Cow<'a, [u8]>,
    note: &'static str,
}

impl<'a> IdxStream<'a> {
    fn open(name: &'a str, file: &'a [u8]) -> Result<IdxStream<'a>, DataError> {
        if file.starts_with(&GZIP_MAGIC) {
            Ok(IdxStream {
                name,
                bytes: std::borrow::Cow::Owned(gunzip(name, file)?),
                note: " (of the gunzipped stream)",
            })
        } else {
            Ok(IdxStream {
                name,
                bytes: std::borrow::Cow::Borrowed(file),
                note: "",
            })
        }
    }

    fn error(&self, offset: usize, what: String) -> DataError {
        DataError::Format {
            path: self.name.to_string(),
            offset: offset as u64,
            stream: self.note,
            what,
        }
    }

    fn u32_at(&self, offset: usize, what: &str) -> Result<u32, DataError> {
        match self.bytes.get(offset..offset + 4) {
            Some(&[a, b, c, d]) => Ok(u32::from_be_bytes([a, b, c, d])),
            _ => Err(self.error(
                offset,
                format!(
                    "expected a 4-byte big-endian {what}, the stream ends after {} bytes",
                    self.bytes.len()
                ),
            )),
        }
    }

    fn expect_magic(&self, magic: u32, what: &str) -> Result<(), DataError> {
        let got = self.u32_at(0, "magic number")?;
        if got == magic {
            return Ok(());
        }
        let hint = match got {
            IDX_IMAGES_MAGIC => " (an image file)",
            IDX_LABELS_MAGIC => " (a label file)",
            _ => "",
        };
        Err(self.error(
            0,
            format!(
                "bad magic {got} (0x{got:08x}){hint}: expected {magic} (0x{magic:08x}, {what})"
            ),
        ))
    }

    /// The `len` bytes from `offset`, which must be exactly the rest of the stream.
    fn exact_rest(&self, offset: usize, len: usize, what: &str) -> Result<&[u8], DataError> {
        let available = self.bytes.len().saturating_sub(offset);
        if available < len {
            return Err(self.error(
                offset,
                format!("expected {len} bytes of {what}, only {available} remain"),
            ));
        }
        if available > len {
            return Err(self.error(
                offset + len,
                format!("{} unexpected bytes after the {what}", available - len),
            ));
        }
        Ok(&self.bytes[offset..])
    }
}

/// Decompresses a whole gzip file; errors carry the compressed offset the decoder had reached.
fn gunzip(name: &str, file: &[u8]) -> Result<Vec<u8>, DataError> {
    let mut decoder = GzDecoder::new(file);
    let mut out = Vec::new();
    match decoder.read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) => {
            let consumed = file.len() - decoder.get_ref().len();
            let detail = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("the file ends inside the compressed stream, truncated? {e}")
            } else {
                e.to_string()
            };
            Err(DataError::Gzip {
                path: name.to_string(),
                offset: consumed as u64,
                decompressed: out.len() as u64,
                detail,
            })
        }
    }
}
