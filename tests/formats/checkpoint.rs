//! Checkpoint files: round trip of every dtype and of metadata, the `checkpoint` index and the
//! ways to name a checkpoint, clear errors on missing/truncated/foreign files, and crash safety
//! (a leftover temp file, and real SIGKILLs of a child process in the middle of saving).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::tensor::{DType, HostTensor, Storage};
use towerpack::train::checkpoint::{
    CheckpointError, CheckpointIndex, CheckpointManager, INDEX_FILE_NAME, RetentionPolicy,
    delete_checkpoint, latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint,
};

fn random_tensor(rng: &mut ChaCha8Rng, dtype: DType, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let special = [f32::NAN, f32::INFINITY, -0.0, f32::MIN_POSITIVE];
    let mut f = |i: usize| {
        if i < special.len() && n > 8 {
            special[i]
        } else {
            rng.random_range(-1e3f32..1e3)
        }
    };
    let floats: Vec<f32> = (0..n).map(&mut f).collect();
    let storage = match dtype {
        DType::F32 => Storage::F32(floats),
        DType::F64 => Storage::F64(floats.iter().map(|&x| f64::from(x) * 1.000_000_1).collect()),
        DType::F16 => Storage::F16(floats.iter().map(|&x| f16::from_f32(x)).collect()),
        DType::BF16 => Storage::BF16(floats.iter().map(|&x| bf16::from_f32(x)).collect()),
        DType::I32 => Storage::I32((0..n).map(|_| rng.random()).collect()),
        DType::I64 => Storage::I64((0..n).map(|_| rng.random()).collect()),
        DType::U8 => Storage::U8((0..n).map(|_| rng.random()).collect()),
        DType::Bool => Storage::Bool((0..n).map(|_| rng.random()).collect()),
    };
    HostTensor::new(shape.to_vec(), storage).expect("element count matches")
}

/// Bit-exact equality (NaN-safe).
fn same_bits(a: &HostTensor, b: &HostTensor) -> bool {
    a.dtype() == b.dtype() && a.shape() == b.shape() && a.to_le_bytes() == b.to_le_bytes()
}

fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn every_dtype_and_the_metadata_round_trip_bit_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let shapes: [&[usize]; 4] = [&[], &[0, 3], &[2, 3, 4], &[17]];
    let mut tensors = Vec::new();
    for dtype in DType::ALL {
        for shape in shapes {
            let name = format!("tower0/{}/{:?}", dtype.name(), shape);
            tensors.push((name, random_tensor(&mut rng, dtype, shape)));
        }
    }
    tensors.push(("global_step".into(), HostTensor::scalar_i64(1234)));
    let meta = metadata(&[
        ("epoch", "7"),
        ("rng", r#"{"seed":[1,2,3],"counter":99}"#),
        ("callbacks", r#"{"MinSaver":{"best":0.125}}"#),
    ]);
    let path = save_checkpoint(dir.path(), 1234, &tensors, &meta).expect("save");
    assert_eq!(path, dir.path().join("model-1234.safetensors"));
    let ckpt = load_checkpoint(&path).expect("load");
    assert_eq!(ckpt.global_step(), Some(1234));
    assert_eq!(ckpt.metadata, meta);
    assert_eq!(ckpt.tensors.len(), tensors.len());
    for (name, t) in &tensors {
        let back = ckpt
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(same_bits(t, back), "{name}: {t:?} vs {back:?}");
    }
}

#[test]
fn index_names_latest_and_every_form_of_path_resolves() {
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = BTreeMap::new();
    assert_eq!(latest_checkpoint(dir.path()).expect("empty dir"), None);
    for step in [100u64, 300, 200] {
        let tensors = vec![("w".to_string(), HostTensor::scalar_f32(step as f32))];
        save_checkpoint(dir.path(), step, &tensors, &empty).expect("save");
    }
    // The index names the last *saved* (200), not the highest step.
    let latest = latest_checkpoint(dir.path()).expect("index").expect("some");
    assert_eq!(latest, dir.path().join("model-200.safetensors"));
    let index = CheckpointIndex::read(dir.path())
        .expect("readable")
        .expect("exists");
    let files: Vec<&str> = index.entries.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(
        files,
        [
            "model-100.safetensors",
            "model-300.safetensors",
            "model-200.safetensors"
        ]
    );
    let text = std::fs::read_to_string(dir.path().join(INDEX_FILE_NAME)).expect("index text");
    assert!(
        text.starts_with("model_checkpoint_path: \"model-200.safetensors\"\n"),
        "{text}"
    );

    let steps: Vec<u64> = list_checkpoints(dir.path())
        .expect("list")
        .iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(steps, [100, 200, 300]);

    let value = |p: &Path| {
        load_checkpoint(p).expect("load").tensors["w"]
            .scalar_value()
            .expect("scalar")
    };
    assert_eq!(value(dir.path()), 200.0, "a directory means its latest");
    assert_eq!(
        value(&dir.path().join(INDEX_FILE_NAME)),
        200.0,
        "so does its index file"
    );
    assert_eq!(value(&dir.path().join("model-300")), 300.0, "a prefix");
    assert_eq!(
        value(&dir.path().join("model-100.safetensors")),
        100.0,
        "a file"
    );

    // Deleting the latest makes the previous indexed one the latest.
    delete_checkpoint(&dir.path().join("model-200")).expect("delete");
    assert_eq!(value(dir.path()), 300.0);
    assert!(!dir.path().join("model-200.safetensors").exists());
    // Without an index, the highest step wins.
    std::fs::remove_file(dir.path().join(INDEX_FILE_NAME)).expect("rm index");
    assert_eq!(value(dir.path()), 300.0);
}

#[test]
fn errors_name_the_file_and_what_failed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let err = load_checkpoint(&d.join("model-9")).unwrap_err();
    assert!(matches!(err, CheckpointError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("model-9"), "{err}");
    let err = load_checkpoint(d).unwrap_err();
    assert!(matches!(err, CheckpointError::NoCheckpoint { .. }), "{err}");

    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let tensors = vec![(
        "w".to_string(),
        random_tensor(&mut rng, DType::F32, &[64, 64]),
    )];
    let good = save_checkpoint(d, 5, &tensors, &metadata(&[("epoch", "1")])).expect("save");
    let bytes = std::fs::read(&good).expect("read");
    for cut in [0usize, 5, 40, bytes.len() / 2, bytes.len() - 1] {
        let path = d.join(format!("cut-{cut}.safetensors"));
        std::fs::write(&path, &bytes[..cut]).expect("write");
        let err = load_checkpoint(&path).unwrap_err();
        let CheckpointError::Truncated { len, needed, .. } = &err else {
            panic!("cut at {cut}: expected Truncated, got {err}");
        };
        assert_eq!(*len, cut as u64);
        assert!(*needed > *len, "{err}");
        assert!(
            err.to_string().contains(&format!("cut-{cut}.safetensors")),
            "{err}"
        );
    }
    let foreign = d.join("notes.safetensors");
    std::fs::write(&foreign, b"model_checkpoint_path: \"x\"\n").expect("write");
    let err = load_checkpoint(&foreign).unwrap_err();
    assert!(
        matches!(err, CheckpointError::NotSafetensors { .. }),
        "{err}"
    );

    // A header with broken JSON of the right length.
    let mut broken = bytes.clone();
    broken[10] = b'#';
    let path = d.join("broken.safetensors");
    std::fs::write(&path, &broken).expect("write");
    let err = load_checkpoint(&path).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");

    // An index naming a vanished file is reported, not silently replaced.
    std::fs::remove_file(&good).expect("rm");
    let err = latest_checkpoint(d).unwrap_err().to_string();
    assert!(
        err.contains("model-5.safetensors") && err.contains("does not exist"),
        "{err}"
    );

    let dup = vec![
        ("w".to_string(), HostTensor::scalar_f32(1.0)),
        ("w".to_string(), HostTensor::scalar_f32(2.0)),
    ];
    let err = save_checkpoint(d, 6, &dup, &BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("`w`") && err.contains("twice"), "{err}");
}

#[test]
fn a_leftover_temp_file_does_not_affect_the_latest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let tensors = vec![("w".to_string(), HostTensor::scalar_f32(1.0))];
    save_checkpoint(d, 100, &tensors, &BTreeMap::new()).expect("save");
    // What a write killed before its rename leaves: a hidden, partial temp file.
    std::fs::write(d.join(".model-200.safetensors.tmp.4242.0"), b"\x10\x00\x00").expect("write");
    std::fs::write(
        d.join(".checkpoint.tmp.4242.1"),
        b"model_checkpoint_path: \"model-2",
    )
    .expect("write");
    assert_eq!(
        latest_checkpoint(d).expect("latest"),
        Some(d.join("model-100.safetensors"))
    );
    assert_eq!(list_checkpoints(d).expect("list").len(), 1);
    assert_eq!(load_checkpoint(d).expect("load").global_step(), Some(100));
}

/// The checkpoint a child saves at `step`: every element equals `step`, metadata says `step`.
fn child_tensors(step: u64) -> Vec<(String, HostTensor)> {
    vec![
        (
            "big".to_string(),
            HostTensor::from_f32(&[1 << 20], vec![step as f32; 1 << 20]).expect("1M"),
        ),
        (
            "global_step".to_string(),
            HostTensor::scalar_i64(step as i64),
        ),
    ]
}

const CHILD_ENV: &str = "TOWERPACK_TEST_CHECKPOINT_CHILD_DIR";

/// Not a test of its own: the body of the child process that `kill_during_save_never_corrupts`
/// SIGKILLs. Without the environment variable it returns at once.
#[test]
fn child_process_saving_checkpoints_forever() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = Path::new(&dir);
    let policy = RetentionPolicy {
        max_to_keep: 2,
        keep_every: None,
    };
    let mut manager = CheckpointManager::open(dir, policy, 0.0).expect("open");
    let mut step = list_checkpoints(dir)
        .expect("list")
        .last()
        .map_or(0, |c| c.1);
    loop {
        step += 1;
        let meta = metadata(&[("step", &step.to_string())]);
        manager
            .save(step, &child_tensors(step), &meta, step as f64)
            .expect("save");
    }
}

#[test]
fn kill_during_save_never_corrupts_the_latest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary path");
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let mut temp_leftovers = 0;
    for round in 0..6 {
        let before = latest_checkpoint(dir.path()).expect("latest");
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                &test_name("child_process_saving_checkpoints_forever"),
                "--nocapture",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        // Wait until the child has saved something new, then kill it at a random moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        while latest_checkpoint(dir.path()).ok().flatten() == before {
            assert!(
                Instant::now() < deadline,
                "round {round}: the child saved nothing"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..120)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");

        temp_leftovers += std::fs::read_dir(dir.path())
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with('.'))
            })
            .count();
        let ckpt = load_checkpoint(dir.path())
            .unwrap_or_else(|e| panic!("round {round}: latest checkpoint unreadable: {e}"));
        let step = ckpt.global_step().expect("model-<step> name");
        assert_eq!(ckpt.metadata["step"], step.to_string());
        assert_eq!(
            ckpt.tensors["global_step"].scalar_value().ok(),
            Some(step as f64)
        );
        assert!(
            ckpt.tensors["big"]
                .to_f32_vec()
                .iter()
                .all(|&x| x == step as f32)
        );
        for (path, _) in list_checkpoints(dir.path()).expect("list") {
            load_checkpoint(&path).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    eprintln!("temp files left by kills mid-write (ignored by readers): {temp_leftovers}");
}

/// The libtest name of this module's test `name`: in a stage's test binary a test's name is
/// its module path without the crate (`stage::module::test`, listed as `module::test`).
fn test_name(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
