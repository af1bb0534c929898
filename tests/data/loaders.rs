//! Loaders: the embedded mnist10k set, IDX files (raw and gzip) and CIFAR-10 binary batches,
//! including errors on missing, truncated and corrupt files (path + byte offset).

use flate2::Compression;
use flate2::write::GzEncoder;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Write;
use std::path::Path;
use towerpack::data::{
    CifarSplit, DataError, LabeledImages, MNIST10K_TRAIN, MNIST10K_VALIDATION, load_cifar10,
    load_mnist, mnist10k, mnist10k_split, read_idx_images, read_idx_labels,
};
use towerpack::tensor::DType;

fn idx_images(count: u32, rows: u32, cols: u32, pixels: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [2051u32, count, rows, cols] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(pixels);
    out
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [2049u32, labels.len() as u32] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(labels);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).expect("in-memory write");
    enc.finish().expect("in-memory gzip")
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("temp file");
}

/// A random MNIST-like pair written as `images`/`labels` files, returned with its contents.
fn random_mnist(dir: &Path, n: usize, gz: bool, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pixels: Vec<u8> = (0..n * 28 * 28).map(|_| rng.random()).collect();
    let labels: Vec<u8> = (0..n).map(|_| rng.random_range(0..10)).collect();
    let (mut img, mut lab) = (idx_images(n as u32, 28, 28, &pixels), idx_labels(&labels));
    if gz {
        img = gzip(&img);
        lab = gzip(&lab);
    }
    write(&dir.join("images"), &img);
    write(&dir.join("labels"), &lab);
    (pixels, labels)
}

fn assert_mentions(err: &DataError, parts: &[&str]) {
    let text = err.to_string();
    for part in parts {
        assert!(
            text.contains(part),
            "error {text:?} should mention {part:?}"
        );
    }
}

#[test]
fn embedded_mnist10k_has_the_readme_label_counts() {
    let set = mnist10k().expect("embedded set parses");
    assert_eq!(set.len(), 10_000);
    assert_eq!(set.images().shape(), &[10_000, 28, 28, 1]);
    assert_eq!(set.images().dtype(), DType::U8);
    assert_eq!(set.labels().dtype(), DType::I32);
    assert_eq!(
        set.label_counts(10),
        vec![1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    );
    // Real digits: mostly black background, some saturated strokes, not constant.
    let px = set.images().to_f64_vec();
    let zeros = px.iter().filter(|&&v| v == 0.0).count() as f64 / px.len() as f64;
    assert!(
        (0.7..0.9).contains(&zeros),
        "fraction of zero pixels {zeros}"
    );
    assert!(px.contains(&255.0));
}

#[test]
fn mnist10k_split_is_first_8000_then_last_2000() {
    let all = mnist10k().expect("embedded");
    let split = mnist10k_split().expect("split");
    assert_eq!(split.train.len(), MNIST10K_TRAIN);
    assert_eq!(split.validation.len(), MNIST10K_VALIDATION);
    assert_eq!(split.train, all.slice(0, 8000).expect("slice"));
    assert_eq!(split.validation, all.slice(8000, 2000).expect("slice"));
    let sum: Vec<usize> = split
        .train
        .label_counts(10)
        .iter()
        .zip(split.validation.label_counts(10))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(sum, all.label_counts(10));
}

#[test]
fn padding_to_32x32x3_centers_and_replicates() {
    let set = mnist10k().expect("embedded").slice(100, 7).expect("slice");
    for s in [set.clone(), set.to_f32(1.0 / 255.0)] {
        let padded = s.pad_and_replicate(2, 3).expect("pad");
        assert_eq!(padded.images().shape(), &[7, 32, 32, 3]);
        assert_eq!(padded.labels(), s.labels());
        let src = s.images().to_f64_vec();
        let out = padded.images().to_f64_vec();
        for i in 0..7 {
            for y in 0..32 {
                for x in 0..32 {
                    let inside = (2..30).contains(&y) && (2..30).contains(&x);
                    let want = if inside {
                        src[(i * 28 + y - 2) * 28 + x - 2]
                    } else {
                        0.0
                    };
                    for c in 0..3 {
                        assert_eq!(
                            out[((i * 32 + y) * 32 + x) * 3 + c],
                            want,
                            "{i} {y} {x} {c}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn datapoints_are_image_and_scalar_label() {
    let set = mnist10k().expect("embedded").slice(0, 3).expect("slice");
    let dps = set.datapoints().expect("datapoints");
    assert_eq!(dps.len(), 3);
    for (i, dp) in dps.iter().enumerate() {
        assert_eq!(dp[0].shape(), &[28, 28, 1]);
        assert_eq!(dp[1].shape(), &[] as &[usize]);
        assert_eq!(
            dp[1].scalar_value().expect("scalar"),
            set.labels().to_f64_vec()[i]
        );
        assert_eq!(
            dp[0].to_f64_vec(),
            set.images().to_f64_vec()[i * 784..(i + 1) * 784]
        );
    }
}

#[test]
fn idx_files_round_trip_raw_and_gzip() {
    for gz in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pixels, labels) = random_mnist(dir.path(), 37, gz, 5 + u64::from(gz));
        let set = load_mnist(&dir.path().join("images"), &dir.path().join("labels")).expect("load");
        assert_eq!(set.images().shape(), &[37, 28, 28, 1]);
        let got: Vec<u8> = set.images().to_f64_vec().iter().map(|&v| v as u8).collect();
        assert_eq!(got, pixels);
        let got: Vec<u8> = set.labels().to_f64_vec().iter().map(|&v| v as u8).collect();
        assert_eq!(got, labels);
        let raw = read_idx_images(&dir.path().join("images")).expect("images");
        assert_eq!((raw.count, raw.rows, raw.cols), (37, 28, 28));
        assert_eq!(
            read_idx_labels(&dir.path().join("labels")).expect("labels"),
            labels
        );
    }
}

#[test]
fn truncated_idx_names_path_offset_and_expected_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = idx_images(10_000, 28, 28, &[7u8; 1200]);
    for gz in [false, true] {
        let path = dir.path().join(if gz { "x.gz" } else { "x" });
        write(&path, &if gz { gzip(&bytes) } else { bytes.clone() });
        let err = read_idx_images(&path).unwrap_err();
        let p = path.display().to_string();
        assert_mentions(
            &err,
            &[
                &p,
                "offset 16",
                "7840000 bytes of image data",
                "only 1200 remain",
            ],
        );
        if gz {
            assert_mentions(&err, &["gunzipped"]);
        }
    }
    // A header cut short.
    let path = dir.path().join("short");
    write(&path, &bytes[..10]);
    let err = read_idx_images(&path).unwrap_err();
    assert_mentions(
        &err,
        &[&path.display().to_string(), "offset 8", "row count"],
    );
}

#[test]
fn bad_magic_and_swapped_files_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    random_mnist(dir.path(), 4, false, 1);
    // Label file given as images and vice versa.
    let err = load_mnist(&dir.path().join("labels"), &dir.path().join("images")).unwrap_err();
    let p = dir.path().join("labels").display().to_string();
    assert_mentions(
        &err,
        &[
            &p,
            "offset 0",
            "bad magic 2049",
            "a label file",
            "expected 2051",
        ],
    );
    let path = dir.path().join("junk");
    write(&path, b"GARBAGE GARBAGE GARBAGE");
    let err = read_idx_labels(&path).unwrap_err();
    assert_mentions(
        &err,
        &[&path.display().to_string(), "offset 0", "expected 2049"],
    );
}

#[test]
fn trailing_bytes_count_mismatch_and_label_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("img");
    let lab = dir.path().join("lab");
    let mut bytes = idx_images(2, 2, 2, &[1; 8]);
    bytes.extend_from_slice(&[0, 0, 0]);
    write(&img, &bytes);
    let err = read_idx_images(&img).unwrap_err();
    assert_mentions(
        &err,
        &[
            &img.display().to_string(),
            "offset 24",
            "3 unexpected bytes",
        ],
    );

    write(&img, &idx_images(2, 2, 2, &[1; 8]));
    write(&lab, &idx_labels(&[1, 2, 3]));
    let err = load_mnist(&img, &lab).unwrap_err();
    assert!(matches!(
        err,
        DataError::CountMismatch {
            image_count: 2,
            label_count: 3,
            ..
        }
    ));
    assert_mentions(
        &err,
        &[&img.display().to_string(), &lab.display().to_string()],
    );

    write(&lab, &idx_labels(&[1, 12]));
    let err = load_mnist(&img, &lab).unwrap_err();
    assert_mentions(&err, &[&lab.display().to_string(), "offset 9", "label 12"]);
}

#[test]
fn missing_file_names_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope-idx3-ubyte.gz");
    let err = read_idx_images(&missing).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }));
    assert_mentions(&err, &[&missing.display().to_string()]);
}

#[test]
fn corrupt_and_truncated_gzip_name_path_and_compressed_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let pixels: Vec<u8> = (0..50 * 784).map(|_| rng.random_range(0..4)).collect();
    let gz = gzip(&idx_images(50, 28, 28, &pixels));
    // Truncated: the compressed stream stops half-way.
    let path = dir.path().join("cut.gz");
    write(&path, &gz[..gz.len() / 2]);
    let err = read_idx_images(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err}");
    assert_mentions(
        &err,
        &[&path.display().to_string(), "offset ", "bad gzip stream"],
    );
    // Corrupt: bytes of the deflate stream overwritten.
    let mut bad = gz.clone();
    for b in &mut bad[20..60] {
        *b ^= 0x5a;
    }
    let path = dir.path().join("bad.gz");
    write(&path, &bad);
    let err = read_idx_images(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err}");
    assert_mentions(
        &err,
        &[&path.display().to_string(), "offset ", "bad gzip stream"],
    );
    // Corrupt trailer (checksum) only.
    let mut bad = gz;
    let n = bad.len();
    bad[n - 6] ^= 0xff;
    write(&path, &bad);
    let err = read_idx_images(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err}");
}

/// Writes CIFAR batch files with random contents; returns (labels, raw records) per file.
fn random_cifar(dir: &Path, files: &[(&str, usize)], seed: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    files
        .iter()
        .map(|&(name, n)| {
            let mut bytes = Vec::new();
            let mut labels = Vec::new();
            for _ in 0..n {
                let label = rng.random_range(0..10u8);
                labels.push(label);
                bytes.push(label);
                bytes.extend((0..3072).map(|_| rng.random::<u8>()));
            }
            write(&dir.join(name), &bytes);
            (labels, bytes)
        })
        .collect()
}

fn check_cifar(set: &LabeledImages, files: &[(Vec<u8>, Vec<u8>)]) {
    let px = set.images().to_f64_vec();
    let labels = set.labels().to_f64_vec();
    let mut i = 0;
    for (file_labels, bytes) in files {
        for (r, &label) in file_labels.iter().enumerate() {
            assert_eq!(labels[i], f64::from(label));
            let rec = &bytes[r * 3073 + 1..(r + 1) * 3073];
            for y in 0..32 {
                for x in 0..32 {
                    for c in 0..3 {
                        let want = f64::from(rec[c * 1024 + y * 32 + x]);
                        assert_eq!(px[((i * 32 + y) * 32 + x) * 3 + c], want);
                    }
                }
            }
            i += 1;
        }
    }
    assert_eq!(i, set.len());
}

#[test]
fn cifar10_records_become_nhwc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = [
        ("data_batch_1.bin", 3),
        ("data_batch_2.bin", 1),
        ("data_batch_3.bin", 2),
        ("data_batch_4.bin", 1),
        ("data_batch_5.bin", 4),
        ("test_batch.bin", 5),
    ];
    let files = random_cifar(dir.path(), &names, 3);
    let train = load_cifar10(dir.path(), CifarSplit::Train).expect("train");
    assert_eq!(train.images().shape(), &[11, 32, 32, 3]);
    check_cifar(&train, &files[..5]);
    let test = load_cifar10(dir.path(), CifarSplit::Test).expect("test");
    check_cifar(&test, &files[5..]);
    let f = test.to_f32(1.0);
    assert_eq!(f.images().dtype(), DType::F32);
    assert_eq!(f.images().to_f64_vec(), test.images().to_f64_vec());
}

#[test]
fn cifar10_errors_name_dir_file_and_record_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing_dir = dir.path().join("cifar-missing");
    let err = load_cifar10(&missing_dir, CifarSplit::Test).unwrap_err();
    assert_mentions(&err, &[&missing_dir.display().to_string(), "not found"]);

    random_cifar(
        dir.path(),
        &[("data_batch_1.bin", 2), ("data_batch_2.bin", 1)],
        4,
    );
    let err = load_cifar10(dir.path(), CifarSplit::Train).unwrap_err();
    let third = dir.path().join("data_batch_3.bin").display().to_string();
    assert_mentions(&err, &[&third]);

    let files = random_cifar(dir.path(), &[("test_batch.bin", 3)], 5);
    let path = dir.path().join("test_batch.bin");
    write(&path, &files[0].1[..2 * 3073 + 1000]);
    let err = load_cifar10(dir.path(), CifarSplit::Test).unwrap_err();
    assert_mentions(
        &err,
        &[
            &path.display().to_string(),
            "offset 6146",
            "record 2 is truncated",
            "ends after 1000",
        ],
    );

    let mut bytes = files[0].1.clone();
    bytes[3073] = 10;
    write(&path, &bytes);
    let err = load_cifar10(dir.path(), CifarSplit::Test).unwrap_err();
    assert_mentions(
        &err,
        &[&path.display().to_string(), "offset 3073", "label 10"],
    );
}
