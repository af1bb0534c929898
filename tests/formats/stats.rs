//! `stats.json`: one record per flush with `epoch_num`/`global_step`, atomic rewrites, and the
//! resume rule (append only when the last epoch precedes `starting_epoch`, else back up).

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use towerpack::train::summary::{
    STATS_FILE_NAME, StartOutcome, StatsJsonWriter, load_existing_epoch_number, load_existing_json,
};

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("readable dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs epochs `first..=last` with two scalars per epoch; returns the values written.
fn run_epochs(
    writer: &mut StatsJsonWriter,
    first: u64,
    last: u64,
    rng: &mut ChaCha8Rng,
) -> Vec<f64> {
    let mut written = Vec::new();
    for epoch in first..=last {
        let loss: f64 = rng.random_range(0.0..5.0);
        writer.add_scalars([("loss", loss), ("lr", 0.1 / epoch as f64)]);
        assert!(writer.flush(epoch, epoch * 100).expect("flush"));
        written.push(loss);
    }
    written
}

#[test]
fn records_hold_scalars_epoch_and_step_and_flush_is_idempotent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut writer = StatsJsonWriter::new(dir.path());
    assert_eq!(writer.on_start(1).expect("start"), StartOutcome::Fresh);
    assert!(
        !writer.flush(0, 0).expect("no data"),
        "nothing put: nothing written"
    );
    assert!(!dir.path().join(STATS_FILE_NAME).exists());
    let losses = run_epochs(&mut writer, 1, 3, &mut rng);
    assert!(!writer.flush(3, 300).expect("no new data"));
    writer.put_scalar("nan_metric", f64::NAN);
    writer.put_scalar("loss", 1.0);
    writer.put_scalar("loss", 2.0); // the later value of a period wins
    assert!(writer.flush(3, 350).expect("flush"));

    let json: Value =
        serde_json::from_slice(&std::fs::read(writer.path()).expect("file")).expect("valid JSON");
    let list = json.as_array().expect("a list");
    assert_eq!(list.len(), 4);
    for (i, loss) in losses.iter().enumerate() {
        let r = &list[i];
        assert_eq!(r["epoch_num"].as_u64(), Some(i as u64 + 1));
        assert_eq!(r["global_step"].as_u64(), Some((i as u64 + 1) * 100));
        assert_eq!(r["loss"].as_f64(), Some(*loss), "values round-trip exactly");
        assert_eq!(r.as_object().map(|o| o.len()), Some(4));
    }
    assert_eq!(list[3]["loss"].as_f64(), Some(2.0));
    assert!(list[3]["nan_metric"].is_null(), "NaN is stored as null");

    let loaded = load_existing_json(dir.path())
        .expect("readable")
        .expect("exists");
    // NaN != NaN, so the record holding it is compared field by field.
    assert_eq!(loaded[..3], writer.records()[..3]);
    assert_eq!((loaded[3].epoch_num, loaded[3].global_step), (3, 350));
    assert_eq!(loaded[3].scalars["loss"], 2.0);
    assert!(loaded[3].scalars["nan_metric"].is_nan());
    assert_eq!(
        load_existing_epoch_number(dir.path()).expect("readable"),
        Some(3)
    );
    assert_eq!(
        file_names(dir.path()),
        vec![STATS_FILE_NAME],
        "no temp file is left behind"
    );
}

#[test]
fn resume_appends_only_after_the_preceding_epoch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut first = StatsJsonWriter::new(dir.path());
    first.on_start(1).expect("start");
    run_epochs(&mut first, 1, 3, &mut rng);

    // Resuming at epoch 4 continues the same file.
    let mut resumed = StatsJsonWriter::new(dir.path());
    assert_eq!(
        resumed.on_start(4).expect("start"),
        StartOutcome::Appending { existing: 3 }
    );
    run_epochs(&mut resumed, 4, 5, &mut rng);
    let all = load_existing_json(dir.path())
        .expect("readable")
        .expect("exists");
    let epochs: Vec<u64> = all.iter().map(|r| r.epoch_num).collect();
    assert_eq!(epochs, vec![1, 2, 3, 4, 5]);

    // Starting over at epoch 1 (or skipping ahead) backs the old file up.
    for starting_epoch in [1, 9] {
        let before = std::fs::read(dir.path().join(STATS_FILE_NAME)).expect("file");
        let mut restarted = StatsJsonWriter::new(dir.path());
        let outcome = restarted.on_start(starting_epoch).expect("start");
        let StartOutcome::BackedUp { backup, reason } = outcome else {
            panic!("expected a backup, got {outcome:?}");
        };
        assert!(
            reason.contains(&format!("starting_epoch={starting_epoch}")),
            "{reason}"
        );
        let backup_name = backup.file_name().and_then(|n| n.to_str()).expect("name");
        let suffix = backup_name
            .strip_prefix("stats.json.")
            .expect("stats.json.<time>");
        assert!(
            suffix.len() >= 11 && suffix.as_bytes()[4] == b'-',
            "MMDD-HHMMSS suffix, got {suffix}"
        );
        assert_eq!(
            std::fs::read(&backup).expect("backup"),
            before,
            "backup keeps the old data"
        );
        assert!(!dir.path().join(STATS_FILE_NAME).exists());
        run_epochs(&mut restarted, starting_epoch, starting_epoch, &mut rng);
        let fresh = load_existing_json(dir.path())
            .expect("readable")
            .expect("exists");
        assert_eq!(fresh.len(), 1);
        assert_eq!(fresh[0].epoch_num, starting_epoch);
    }
    // Two backups in the same second must not overwrite each other.
    let backups = file_names(dir.path())
        .into_iter()
        .filter(|n| n.starts_with("stats.json."))
        .count();
    assert_eq!(backups, 2);
}

#[test]
fn corrupt_or_empty_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(STATS_FILE_NAME);
    std::fs::write(&path, "[]").expect("write");
    let mut writer = StatsJsonWriter::new(dir.path());
    assert_eq!(
        writer.on_start(7).expect("start"),
        StartOutcome::Appending { existing: 0 }
    );
    assert_eq!(
        load_existing_epoch_number(dir.path()).expect("readable"),
        None
    );

    std::fs::write(&path, "[{\"loss\": 1.0}]").expect("write");
    let err = load_existing_json(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("stats.json") && err.contains("epoch_num"),
        "{err}"
    );
    std::fs::write(&path, "{not json").expect("write");
    let err = load_existing_epoch_number(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("stats.json"), "{err}");
    // A writer never blocks on an unreadable file: it moves it aside and says why.
    let outcome = writer.on_start(1).expect("start");
    assert!(
        matches!(&outcome, StartOutcome::BackedUp { reason, .. } if reason.contains("not a valid stats file")),
        "{outcome:?}"
    );
    assert_eq!(load_existing_json(dir.path()).expect("no file"), None);
}
