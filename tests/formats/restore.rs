//! Restoring: matching checkpoint tensors to graph variables in both directions (exact and
//! relaxed), and the retention policy applied to a real checkpoint directory with a fake clock.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::tensor::{DType, HostTensor};
use towerpack::train::checkpoint::{
    CheckpointIndex, CheckpointManager, RestoreMode, RestoreOptions, RetentionPolicy, VariableSpec,
    is_training_only_name, list_checkpoints, load_checkpoint, match_for_restore,
};

fn spec(name: &str, dtype: DType, shape: &[usize]) -> VariableSpec {
    VariableSpec {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
    }
}

fn random_f32(rng: &mut ChaCha8Rng, shape: &[usize]) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32(shape, (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
        .expect("element count")
}

#[test]
fn training_only_names_follow_tensorpack() {
    for name in [
        "conv0/W/Momentum",
        "fc/b/Adam",
        "fc/b/Adam_1:0",
        "EMA/loss",
        "tower0/EMA/cost",
        "AccumGrad/counter",
        "fc/W/AccumGrad",
        "apply_gradients/beta1_power",
        "w/RMSProp_1",
    ] {
        assert!(is_training_only_name(name), "{name}");
    }
    for name in [
        "global_step",
        "learning_rate",
        "conv0/W",
        "bn/mean/EMA",
        "Adam",
    ] {
        assert!(!is_training_only_name(name), "{name}");
    }
}

#[test]
fn names_on_one_side_are_reported_in_both_directions() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut ckpt = BTreeMap::new();
    for (name, shape) in [
        ("conv0/W", &[3, 3, 1, 4][..]),
        ("conv0/b:0", &[4]),
        ("old_head/W", &[4, 2]),
        ("conv0/W/Momentum", &[3, 3, 1, 4]),
        ("EMA/loss", &[]),
        ("skip_me", &[1]),
    ] {
        ckpt.insert(name.to_string(), random_f32(&mut rng, shape));
    }
    ckpt.insert("global_step".to_string(), HostTensor::scalar_i64(500));
    let graph = [
        spec("conv0/W:0", DType::F32, &[3, 3, 1, 4]),
        spec("conv0/b", DType::F32, &[4]),
        spec("global_step", DType::I64, &[]),
        spec("new_head/W", DType::F32, &[4, 10]),
        spec("new_head/W/Adam", DType::F32, &[4, 10]),
    ];
    let options = RestoreOptions {
        ignore: vec!["skip_me:0".into()],
        ..RestoreOptions::exact()
    };
    let plan = match_for_restore(&graph, &ckpt, &options).expect("no conflicts");
    let assigned: Vec<&str> = plan.assignments.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(assigned, ["conv0/W:0", "conv0/b", "global_step"]);
    assert_eq!(plan.assignments[0].1, ckpt["conv0/W"]);
    assert_eq!(plan.assignments[1].1, ckpt["conv0/b:0"]);
    assert_eq!(plan.report.only_in_graph, ["new_head/W"]);
    assert_eq!(plan.report.only_in_checkpoint, ["old_head/W"]);
    let mut quiet = plan.report.training_only_unmatched.clone();
    quiet.sort();
    assert_eq!(quiet, ["EMA/loss", "conv0/W/Momentum", "new_head/W/Adam"]);
    assert_eq!(plan.report.ignored, ["skip_me"]);
    let warnings = plan.report.warnings().join("\n");
    assert!(
        warnings.contains("new_head/W") && warnings.contains("old_head/W"),
        "{warnings}"
    );
    assert!(
        !warnings.contains("Momentum") && !warnings.contains("skip_me"),
        "{warnings}"
    );

    // A prefix on the graph side is stripped before matching.
    let prefixed = [spec("student/conv0/W", DType::F32, &[3, 3, 1, 4])];
    let options = RestoreOptions {
        prefix: Some("student".into()),
        ..RestoreOptions::exact()
    };
    let plan = match_for_restore(&prefixed, &ckpt, &options).expect("match");
    assert_eq!(plan.assignments.len(), 1);
    assert_eq!(plan.assignments[0].0, "student/conv0/W");
}

#[test]
fn exact_mode_errors_name_the_variable_and_both_shapes() {
    let mut ckpt = BTreeMap::new();
    ckpt.insert("fc/W".to_string(), HostTensor::zeros(DType::F32, &[4, 2]));
    let graph = [spec("fc/W", DType::F32, &[2, 4])];
    let err = match_for_restore(&graph, &ckpt, &RestoreOptions::exact()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("fc/W") && text.contains("[2, 4]") && text.contains("[4, 2]"),
        "{text}"
    );
    let graph = [spec("fc/W", DType::F64, &[4, 2])];
    let text = match_for_restore(&graph, &ckpt, &RestoreOptions::exact())
        .unwrap_err()
        .to_string();
    assert!(text.contains("f64") && text.contains("f32"), "{text}");
}

#[test]
fn relaxed_mode_reshapes_casts_and_skips() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let w = random_f32(&mut rng, &[4, 6]);
    let mut ckpt = BTreeMap::new();
    ckpt.insert("reshape".to_string(), w.clone());
    ckpt.insert("to_f64".to_string(), w.clone());
    ckpt.insert("to_bf16".to_string(), w.clone());
    ckpt.insert(
        "counter".to_string(),
        HostTensor::from_i32(&[3], vec![7, -2, 1 << 30]).expect("3"),
    );
    ckpt.insert(
        "narrow".to_string(),
        HostTensor::from_i64(&[2], vec![1, 2]).expect("2"),
    );
    ckpt.insert("count".to_string(), w.clone());
    ckpt.insert("to_int".to_string(), w.clone());
    let graph = [
        spec("reshape", DType::F32, &[2, 12]),
        spec("to_f64", DType::F64, &[4, 6]),
        spec("to_bf16", DType::BF16, &[24]),
        spec("counter", DType::I64, &[3]),
        spec("narrow", DType::I32, &[2]),
        spec("count", DType::F32, &[5, 5]),
        spec("to_int", DType::I32, &[4, 6]),
    ];
    let plan = match_for_restore(&graph, &ckpt, &RestoreOptions::relaxed()).expect("relaxed");
    let got: BTreeMap<&str, &HostTensor> = plan
        .assignments
        .iter()
        .map(|(n, t)| (n.as_str(), t))
        .collect();
    assert_eq!(got.len(), 4);
    assert_eq!(got["reshape"].shape(), [2, 12]);
    assert_eq!(
        got["reshape"].as_f32().ok(),
        w.as_f32().ok(),
        "row-major order is kept"
    );
    let wide = got["to_f64"].to_f64_vec();
    for (a, b) in wide.iter().zip(w.as_f32().expect("f32")) {
        assert_eq!(*a, f64::from(*b), "f32 -> f64 is exact");
    }
    assert_eq!(
        (got["to_bf16"].dtype(), got["to_bf16"].shape()),
        (DType::BF16, &[24][..])
    );
    for (a, b) in got["to_bf16"]
        .to_f64_vec()
        .iter()
        .zip(w.as_f32().expect("f32"))
    {
        assert!(
            (a - f64::from(*b)).abs() <= 1e-2 * f64::from(b.abs()).max(1e-3),
            "{a} vs {b}"
        );
    }
    assert_eq!(got["counter"].to_f64_vec(), [7.0, -2.0, f64::from(1 << 30)]);
    assert_eq!(got["counter"].dtype(), DType::I64);
    let skipped: Vec<&str> = plan
        .report
        .incompatible
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(skipped, ["narrow", "count", "to_int"]);
    assert_eq!(plan.report.converted.len(), 4);
    let warnings = plan.report.warnings().join("\n");
    assert!(
        warnings.contains("`narrow` is i32[2] in the graph but i64[2]"),
        "{warnings}"
    );
    assert_eq!(RestoreOptions::relaxed().mode, RestoreMode::Relaxed);
}

#[test]
fn retention_on_disk_with_a_fake_clock_survives_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let policy = RetentionPolicy {
        max_to_keep: 3,
        keep_every: Some(Duration::from_secs(3600)),
    };
    let start = 1_700_000_000.0;
    let tensors = |s: u64| vec![("step".to_string(), HostTensor::scalar_i64(s as i64))];
    let meta = BTreeMap::new();
    // One save every 20 minutes for 4 hours, with a "restart" halfway.
    let mut manager = CheckpointManager::open(d, policy, start).expect("open");
    let mut deleted = Vec::new();
    for k in 1..=12u64 {
        if k == 7 {
            manager =
                CheckpointManager::open(d, policy, start + 7.0 * 1200.0 - 1.0).expect("reopen");
        }
        let saved = manager
            .save(k * 100, &tensors(k * 100), &meta, start + k as f64 * 1200.0)
            .expect("save");
        assert!(saved.failed_deletes.is_empty());
        deleted.extend(
            saved
                .deleted
                .iter()
                .map(|p| p.file_name().expect("name").to_owned()),
        );
    }
    let on_disk: Vec<u64> = list_checkpoints(d)
        .expect("list")
        .into_iter()
        .map(|c| c.1)
        .collect();
    // Preserved: the first save ≥ 1 h after the start (k=3, at 1 h), then each first save ≥ 1 h
    // after the previous preserved one (k=6, k=9); the restart kept the hourly state. The last 3
    // are managed.
    assert_eq!(on_disk, [300, 600, 900, 1000, 1100, 1200]);
    assert_eq!(deleted.len(), 6);
    let index = CheckpointIndex::read(d).expect("readable").expect("exists");
    let managed: Vec<&str> = index.entries.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(
        managed,
        [
            "model-1000.safetensors",
            "model-1100.safetensors",
            "model-1200.safetensors"
        ]
    );
    assert_eq!(index.last_preserved_timestamp, Some(start + 9.0 * 1200.0));
    assert_eq!(
        load_checkpoint(d).expect("latest").global_step(),
        Some(1200)
    );
}
