//! TensorBoard event files: CRC32C and masking, TFRecord framing, and a read-back of scalars, a
//! histogram and images by the real TensorBoard (`EventAccumulator`, run through `python3`).

use std::path::Path;
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use towerpack::tensor::{HostTensor, Storage};
use towerpack::train::summary::record::{frame_record, parse_records};
use towerpack::train::summary::{
    EventFileWriter, PixelRange, crc32c, histogram_of, mask_crc, masked_crc32c, read_records,
};

/// Runs `script` with `python3`, failing clearly when python3 or tensorboard is missing.
fn run_python(script: &str, args: &[&str]) -> String {
    let probe = Command::new("python3")
        .args(["-c", "import tensorboard"])
        .output();
    match probe {
        Err(e) => panic!(
            "python3 is needed to read event files back with TensorBoard ({e}); install Python 3 and run `pip install tensorboard`"
        ),
        Ok(out) if !out.status.success() => panic!(
            "the tensorboard Python package is missing; run `pip install tensorboard` (CI installs it)\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(_) => {}
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 ran a moment ago");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("python prints UTF-8")
}

#[test]
fn crc32c_known_value_and_masking() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    // mask(0) is the mask constant itself; mask rotates right by 15 then adds it.
    assert_eq!(mask_crc(0), 0xA282_EAD8);
    assert_eq!(mask_crc(0x0000_8000), 0xA282_EAD9);
    assert_eq!(mask_crc(1), 0x0002_0000u32.wrapping_add(0xA282_EAD8));
}

#[test]
fn masked_crc_agrees_with_tensorboards_python_implementation() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let payloads: Vec<Vec<u8>> = (0..20)
        .map(|i| (0..i * 7).map(|_| rng.random()).collect())
        .collect();
    let hex: Vec<String> = payloads
        .iter()
        .map(|p| p.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let script = "import sys\n\
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c\n\
        print(' '.join(str(masked_crc32c(bytes.fromhex(h))) for h in sys.argv[1:]))";
    let args: Vec<&str> = hex.iter().map(String::as_str).collect();
    let theirs: Vec<u32> = run_python(script, &args)
        .split_whitespace()
        .map(|s| s.parse().expect("a u32"))
        .collect();
    let ours: Vec<u32> = payloads.iter().map(|p| masked_crc32c(p)).collect();
    assert_eq!(ours, theirs);
}

#[test]
fn record_framing_layout_round_trip_and_corruption() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let payloads: Vec<Vec<u8>> = (0..5)
        .map(|_| {
            let n = rng.random_range(0..300);
            (0..n).map(|_| rng.random()).collect()
        })
        .collect();
    let framed = frame_record(&payloads[1]);
    let n = payloads[1].len();
    assert_eq!(framed.len(), n + 16);
    assert_eq!(&framed[..8], &(n as u64).to_le_bytes());
    assert_eq!(&framed[8..12], &masked_crc32c(&framed[..8]).to_le_bytes());
    assert_eq!(&framed[12..12 + n], payloads[1].as_slice());
    assert_eq!(
        &framed[12 + n..],
        &masked_crc32c(&payloads[1]).to_le_bytes()
    );

    let stream: Vec<u8> = payloads.iter().flat_map(|p| frame_record(p)).collect();
    let path = Path::new("stream");
    assert_eq!(parse_records(path, &stream).expect("intact"), payloads);

    // Flip one payload byte of the third record: the error names its offset.
    let third_offset: usize = payloads[..2].iter().map(|p| p.len() + 16).sum();
    let mut bad = stream.clone();
    if payloads[2].is_empty() {
        bad[third_offset] ^= 1; // corrupt the length instead
    } else {
        bad[third_offset + 12] ^= 0x40;
    }
    let err = parse_records(path, &bad).unwrap_err().to_string();
    assert!(
        err.contains(&format!("byte {third_offset}")) && err.contains("CRC"),
        "{err}"
    );
    let err = parse_records(path, &stream[..stream.len() - 3])
        .unwrap_err()
        .to_string();
    assert!(err.contains("truncated"), "{err}");
}

fn decode_png(hex: &str) -> (u32, u32, png::ColorType, Vec<u8>) {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("small image")];
    let info = reader.next_frame(&mut buf).expect("one frame");
    buf.truncate(info.buffer_size());
    (info.width, info.height, info.color_type, buf)
}

const READ_BACK: &str = r#"
import sys, json
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "histograms": 0, "images": 0})
acc.Reload()
tags = acc.Tags()
out = {"tags": {k: sorted(tags[k]) for k in ("scalars", "histograms", "images")},
       "scalars": {}, "histograms": {}, "images": {}}
for t in tags["scalars"]:
    out["scalars"][t] = [[e.step, e.value] for e in acc.Scalars(t)]
for t in tags["histograms"]:
    out["histograms"][t] = [dict(step=e.step, min=e.histogram_value.min, max=e.histogram_value.max,
        num=e.histogram_value.num, sum=e.histogram_value.sum, sum_squares=e.histogram_value.sum_squares,
        bucket_limit=list(e.histogram_value.bucket_limit), bucket=list(e.histogram_value.bucket))
        for e in acc.Histograms(t)]
for t in tags["images"]:
    out["images"][t] = [dict(step=e.step, width=e.width, height=e.height,
                             png=e.encoded_image_string.hex()) for e in acc.Images(t)]
print(json.dumps(out))
"#;

#[test]
fn tensorboard_reads_scalars_histograms_and_images() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut writer = EventFileWriter::create(dir.path()).expect("event file");
    let name = writer
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("utf-8 name")
        .to_string();
    assert!(
        name.starts_with("events.out.tfevents.")
            && name.ends_with(&format!(".{}", std::process::id())),
        "{name}"
    );

    let losses: Vec<(u64, f64)> = (0..6)
        .map(|i| (i * 10, rng.random_range(-3.0..3.0)))
        .collect();
    for &(step, v) in &losses {
        writer.put_scalar("loss", v, step).expect("scalar");
    }
    writer.put_scalar("lr", 0.1, 50).expect("scalar");

    let weights: Vec<f32> = (0..500).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let hist_tensor = HostTensor::from_f32(&[20, 25], weights.clone()).expect("500 values");
    writer
        .put_histogram("conv0/W", &hist_tensor, 50)
        .expect("histogram");

    let rgb: Vec<u8> = (0..2 * 5 * 7 * 3).map(|_| rng.random()).collect();
    let batch = HostTensor::new(vec![2, 5, 7, 3], Storage::U8(rgb.clone())).expect("NHWC");
    writer
        .put_image("samples", &batch, PixelRange::Byte, 50)
        .expect("image");
    let gray: Vec<f32> = (0..4 * 3).map(|_| rng.random_range(-0.1f32..1.1)).collect();
    let gray_tensor = HostTensor::from_f32(&[4, 3], gray.clone()).expect("HW");
    writer
        .put_image("gray", &gray_tensor, PixelRange::Unit, 60)
        .expect("image");
    writer.flush().expect("flush");

    // Flushed (not yet closed) events are readable.
    let out = run_python(READ_BACK, &[dir.path().to_str().expect("utf-8 path")]);
    writer.close().expect("close");
    let got: Value = serde_json::from_str(&out).expect("JSON from python");

    assert_eq!(got["tags"]["scalars"], serde_json::json!(["loss", "lr"]));
    assert_eq!(got["tags"]["histograms"], serde_json::json!(["conv0/W"]));
    assert_eq!(
        got["tags"]["images"],
        serde_json::json!(["gray", "samples/0", "samples/1"])
    );

    let loss = got["scalars"]["loss"].as_array().expect("list");
    assert_eq!(loss.len(), losses.len());
    for (event, &(step, v)) in loss.iter().zip(&losses) {
        assert_eq!(event[0].as_u64(), Some(step));
        // simple_value is an f32: exact after rounding to f32.
        assert_eq!(event[1].as_f64().map(|x| x as f32), Some(v as f32));
    }
    assert_eq!(
        got["scalars"]["lr"][0][1].as_f64().map(|x| x as f32),
        Some(0.1f32)
    );

    let h = &got["histograms"]["conv0/W"][0];
    assert_eq!(h["step"].as_u64(), Some(50));
    let values: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
    let expected = histogram_of("conv0/W", &values).expect("finite");
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(h["min"].as_f64(), Some(min));
    assert_eq!(h["max"].as_f64(), Some(max));
    assert_eq!(h["num"].as_f64(), Some(500.0));
    let sum: f64 = values.iter().sum();
    assert!((h["sum"].as_f64().expect("sum") - sum).abs() < 1e-9 * (1.0 + sum.abs()));
    let limits: Vec<f64> = serde_json::from_value(h["bucket_limit"].clone()).expect("list");
    let counts: Vec<f64> = serde_json::from_value(h["bucket"].clone()).expect("list");
    assert_eq!(limits, expected.bucket_limit);
    assert_eq!(counts, expected.bucket);
    assert_eq!(counts.iter().sum::<f64>(), 500.0);

    for k in 0..2 {
        let img = &got["images"][format!("samples/{k}")][0];
        assert_eq!(
            (img["width"].as_u64(), img["height"].as_u64()),
            (Some(7), Some(5))
        );
        let (w, h, color, pixels) = decode_png(img["png"].as_str().expect("hex"));
        assert_eq!((w, h, color), (7, 5, png::ColorType::Rgb));
        assert_eq!(pixels, rgb[k * 105..(k + 1) * 105]);
    }
    let img = &got["images"]["gray"][0];
    assert_eq!(img["step"].as_u64(), Some(60));
    let (w, h, color, pixels) = decode_png(img["png"].as_str().expect("hex"));
    assert_eq!((w, h, color), (3, 4, png::ColorType::Grayscale));
    let expected: Vec<u8> = gray
        .iter()
        .map(|&v| (f64::from(v) * 255.0).clamp(0.0, 255.0).round() as u8)
        .collect();
    assert_eq!(pixels, expected);
}

#[test]
fn event_file_starts_with_file_version_and_frames_verify() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut first = EventFileWriter::create(dir.path()).expect("event file");
    let second = EventFileWriter::create(dir.path()).expect("a second file in the same second");
    assert_ne!(
        first.path(),
        second.path(),
        "two writers never share a file"
    );
    first.put_scalar("x", 1.0, 1).expect("scalar");
    let path = first.path().to_path_buf();
    first.close().expect("close");
    let records = read_records(&path).expect("valid framing");
    assert_eq!(records.len(), 2);
    // Event{wall_time (field 1, fixed64), file_version (field 3) = "brain.Event:2"}.
    assert_eq!(records[0][0], 0x09);
    assert_eq!(&records[0][9..11], &[0x1a, 13]);
    assert_eq!(&records[0][11..], b"brain.Event:2");
}

#[test]
fn bad_inputs_are_errors_naming_the_tag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut writer = EventFileWriter::create(dir.path()).expect("event file");
    let nan = HostTensor::from_f32(&[3], vec![1.0, f32::NAN, 2.0]).expect("3 values");
    let err = writer
        .put_histogram("w/grad", &nan, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("w/grad") && err.contains("element 1"), "{err}");
    let five_channels = HostTensor::zeros(towerpack::tensor::DType::U8, &[1, 2, 2, 5]);
    let err = writer
        .put_image("img", &five_channels, PixelRange::Byte, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("img") && err.contains("5 channels"), "{err}");
    let ints = HostTensor::zeros(towerpack::tensor::DType::I64, &[2, 2]);
    let err = writer
        .put_image("i", &ints, PixelRange::Byte, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dtype i64"), "{err}");
}
