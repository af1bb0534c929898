//! TFRecord framing, the container of TensorBoard event files: each record is a little-endian
//! `u64` length, the masked CRC32C of those 8 bytes, the payload, and the masked CRC32C of the
//! payload. Writing is used by the event writer; reading exists to verify files (tests, tools).

use std::io::{self, Write};
use std::path::Path;

use super::MonitorError;

/// The constant TensorFlow adds when masking a CRC (`kMaskDelta`).
const MASK_DELTA: u32 = 0xA282_EAD8;

/// CRC32C (Castagnoli, polynomial `0x82F63B78`) of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// TensorFlow's masked CRC: rotate right by 15 bits, then add `MASK_DELTA` (wrapping).
///
/// Masking keeps a CRC stored next to the data it covers from being a valid CRC of data that
/// itself contains CRCs.
pub fn mask_crc(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// The inverse of [`mask_crc`].
pub fn unmask_crc(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

/// Masked CRC32C of `bytes`, as stored in a record.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    mask_crc(crc32c(bytes))
}

/// The framed bytes of one record holding `payload`.
pub fn frame_record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    out
}

/// Writes one framed record to `out`.
pub fn write_record(out: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    out.write_all(&frame_record(payload))
}

/// Splits framed bytes into payloads, checking both CRCs of every record.
///
/// `path` only names the source in errors, which carry the byte offset of the bad record.
pub fn parse_records(path: &Path, bytes: &[u8]) -> Result<Vec<Vec<u8>>, MonitorError> {
    let corrupt = |offset: usize, what: String| MonitorError::CorruptRecord {
        path: path.to_path_buf(),
        offset: offset as u64,
        what,
    };
    let mut records = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let header = bytes
            .get(pos..pos + 12)
            .ok_or_else(|| corrupt(pos, "truncated record header".into()))?;
        let (len_bytes, len_crc) = header.split_at(8);
        let stored = u32::from_le_bytes([len_crc[0], len_crc[1], len_crc[2], len_crc[3]]);
        if stored != masked_crc32c(len_bytes) {
            return Err(corrupt(pos, "length CRC mismatch".into()));
        }
        let mut len_arr = [0u8; 8];
        len_arr.copy_from_slice(len_bytes);
        let len = u64::from_le_bytes(len_arr);
        let start = pos + 12;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|&e| e.checked_add(4).is_some_and(|t| t <= bytes.len()))
            .ok_or_else(|| corrupt(pos, format!("truncated record: payload of {len} bytes")))?;
        let payload = &bytes[start..end];
        let crc_bytes = &bytes[end..end + 4];
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        if stored != masked_crc32c(payload) {
            return Err(corrupt(pos, "payload CRC mismatch".into()));
        }
        records.push(payload.to_vec());
        pos = end + 4;
    }
    Ok(records)
}

/// Reads every record payload of the file at `path` (see [`parse_records`]).
pub fn read_records(path: &Path) -> Result<Vec<Vec<u8>>, MonitorError> {
    let bytes = std::fs::read(path).map_err(|source| MonitorError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_records(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_round_trips() {
        for c in [0u32, 1, 0xE306_9283, u32::MAX, 0x8000_0000] {
            assert_eq!(unmask_crc(mask_crc(c)), c);
        }
    }
}
