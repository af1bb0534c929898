//! A minimal protobuf *encoder* for the three TensorBoard messages the project writes: `Event`,
//! `Summary` (with its `Value` and `Image`) and `HistogramProto`.
//!
//! Why hand-written: the wire format needs four encodings (varint, fixed64, fixed32,
//! length-delimited) and the messages have a dozen fields between them; a protobuf crate would
//! add codegen (`prost-build` + `protoc` or vendored `.proto` files) for what is ~100 lines.
//! Field numbers follow `tensorflow/core/util/event.proto` and `framework/summary.proto`.

/// Wire types of the protobuf encoding.
const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

/// Appends `value` as a base-128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from((field << 3) | wire));
}

/// An `int32`/`int64` field: negative values are sign-extended to 64 bits (10 bytes), as
/// protobuf specifies for non-`sint` integer types.
pub fn put_int(out: &mut Vec<u8>, field: u32, value: i64) {
    put_key(out, field, WIRE_VARINT);
    put_varint(out, value as u64);
}

/// A `double` field.
pub fn put_f64(out: &mut Vec<u8>, field: u32, value: f64) {
    put_key(out, field, WIRE_FIXED64);
    out.extend_from_slice(&value.to_le_bytes());
}

/// A `float` field.
pub fn put_f32(out: &mut Vec<u8>, field: u32, value: f32) {
    put_key(out, field, WIRE_FIXED32);
    out.extend_from_slice(&value.to_le_bytes());
}

/// A `bytes`, `string` or embedded-message field.
pub fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A packed `repeated double` field (proto3's default encoding for repeated scalars).
pub fn put_packed_f64(out: &mut Vec<u8>, field: u32, values: &[f64]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, (values.len() * 8) as u64);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// `HistogramProto`: the summary of a distribution (see [`super::histogram`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramProto {
    pub min: f64,
    pub max: f64,
    pub num: f64,
    pub sum: f64,
    pub sum_squares: f64,
    /// Upper edge of each bucket; bucket `i` covers `[bucket_limit[i-1], bucket_limit[i])`.
    pub bucket_limit: Vec<f64>,
    /// Count of each bucket.
    pub bucket: Vec<f64>,
}

impl HistogramProto {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + 16 * self.bucket.len());
        put_f64(&mut out, 1, self.min);
        put_f64(&mut out, 2, self.max);
        put_f64(&mut out, 3, self.num);
        put_f64(&mut out, 4, self.sum);
        put_f64(&mut out, 5, self.sum_squares);
        put_packed_f64(&mut out, 6, &self.bucket_limit);
        put_packed_f64(&mut out, 7, &self.bucket);
        out
    }
}

/// `Summary.Image`: one encoded (PNG) image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProto {
    pub height: u32,
    pub width: u32,
    /// 1 grayscale, 2 grayscale + alpha, 3 RGB, 4 RGBA.
    pub colorspace: u32,
    pub encoded: Vec<u8>,
}

impl ImageProto {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded.len() + 16);
        put_int(&mut out, 1, i64::from(self.height));
        put_int(&mut out, 2, i64::from(self.width));
        put_int(&mut out, 3, i64::from(self.colorspace));
        put_bytes(&mut out, 4, &self.encoded);
        out
    }
}

/// The payload of one `Summary.Value` (the `value` oneof).
#[derive(Clone, Debug, PartialEq)]
pub enum SummaryPayload {
    /// `simple_value` (field 2).
    Scalar(f32),
    /// `image` (field 4).
    Image(ImageProto),
    /// `histo` (field 5).
    Histogram(HistogramProto),
}

/// `Summary.Value`: a tagged payload.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryValue {
    pub tag: String,
    pub payload: SummaryPayload,
}

impl SummaryValue {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_bytes(&mut out, 1, self.tag.as_bytes());
        // Oneof members are always written, even when zero: readers test presence
        // (`HasField("simple_value")`) to learn the payload kind.
        match &self.payload {
            SummaryPayload::Scalar(v) => put_f32(&mut out, 2, *v),
            SummaryPayload::Image(img) => put_bytes(&mut out, 4, &img.encode()),
            SummaryPayload::Histogram(h) => put_bytes(&mut out, 5, &h.encode()),
        }
        out
    }
}

/// What an [`Event`] carries (the `what` oneof).
#[derive(Clone, Debug, PartialEq)]
pub enum EventContent {
    /// `file_version` (field 3): `"brain.Event:2"` in the first event of a file.
    FileVersion(String),
    /// `summary` (field 5): a `Summary` with its `value`s (field 1, repeated).
    Summary(Vec<SummaryValue>),
}

/// `Event`: one record of an event file.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    pub step: i64,
    pub content: EventContent,
}

impl Event {
    /// The protobuf encoding of this event.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_f64(&mut out, 1, self.wall_time);
        if self.step != 0 {
            put_int(&mut out, 2, self.step);
        }
        match &self.content {
            EventContent::FileVersion(v) => put_bytes(&mut out, 3, v.as_bytes()),
            EventContent::Summary(values) => {
                let mut summary = Vec::new();
                for value in values {
                    put_bytes(&mut summary, 1, &value.encode());
                }
                put_bytes(&mut out, 5, &summary);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_matches_the_protobuf_spec_examples() {
        // From the protobuf encoding guide: 1 -> 01, 150 -> 96 01, 300 -> ac 02.
        for (value, bytes) in [
            (1u64, vec![0x01]),
            (150, vec![0x96, 0x01]),
            (300, vec![0xac, 0x02]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
        }
        let mut out = Vec::new();
        put_int(&mut out, 1, -1);
        assert_eq!(
            out.len(),
            11,
            "negative int64 takes a key and 10 varint bytes"
        );
    }

    #[test]
    fn scalar_event_has_the_documented_layout() {
        let event = Event {
            wall_time: 1.5,
            step: 7,
            content: EventContent::Summary(vec![SummaryValue {
                tag: "loss".into(),
                payload: SummaryPayload::Scalar(0.25),
            }]),
        };
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 7]);
        // Summary (field 5) holding Value (field 1) holding tag (1) and simple_value (2).
        let mut value = vec![0x0a, 4];
        value.extend_from_slice(b"loss");
        value.push(0x15);
        value.extend_from_slice(&0.25f32.to_le_bytes());
        expected.extend_from_slice(&[0x2a, value.len() as u8 + 2, 0x0a, value.len() as u8]);
        expected.extend_from_slice(&value);
        assert_eq!(event.encode(), expected);
    }
}
