//! Monitors driven by real runs: `stats.json` records and its append-or-back-up rule, the
//! TensorBoard events file read back by TensorBoard's own `EventAccumulator`, `ScalarPrinter`
//! lines, and the history API with tower prefixes stripped.

use crate::train_common;

use std::process::Command;

use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::*;
use towerpack::train::summary::load_existing_json;
use towerpack::train::summary::proto::{Event, EventContent, SummaryPayload, SummaryValue};
use towerpack::train::*;
use train_common::*;

/// Puts a tower-prefixed scalar every step and an image and a histogram every epoch.
struct Producer;

impl Callback for Producer {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let g = ctx.global_step() as f64;
        ctx.put_scalar("tower0/step_value-summary", g * 0.5)
    }
    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let pixels: Vec<f32> = (0..4 * 6 * 3).map(|i| (i * 3 % 256) as f32).collect();
        ctx.put_image(
            "sample",
            &HostTensor::from_f32(&[4, 6, 3], pixels).expect("image"),
        )?;
        let w = ctx.read_variable("fc0/W")?;
        ctx.put_histogram("fc0/W", &w)?;
        // A raw event: the monitors stamp it with the global step.
        let value = SummaryValue {
            tag: "raw_event".into(),
            payload: SummaryPayload::Scalar(ctx.epoch_num() as f32),
        };
        ctx.put_event(Event {
            wall_time: 0.0,
            step: 0,
            content: EventContent::Summary(vec![value]),
        })
    }
}

fn run_python(script: &str, args: &[&str]) -> String {
    let probe = Command::new("python3")
        .args(["-c", "import tensorboard"])
        .output();
    match probe {
        Err(e) => panic!("python3 is needed to read events back with TensorBoard: {e}"),
        Ok(out) if !out.status.success() => panic!(
            "the tensorboard Python package is missing; run `pip install tensorboard`\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(_) => {}
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

const READ_EVENTS: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0, 'histograms': 0, 'images': 0})
acc.Reload()
tags = acc.Tags()
out = {
    'scalars': {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags['scalars']},
    'histograms': {t: [[e.step, e.histogram_value.num] for e in acc.Histograms(t)] for t in tags['histograms']},
    'images': {t: [[e.step, e.width, e.height] for e in acc.Images(t)] for t in tags['images']},
}
print(json.dumps(out))
"#;

#[test]
fn tensorboard_reads_the_events_file_of_a_real_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let infs: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::default())];
    let c = config(mlp_model(0.1), train_flow(96, 32, 1), Some(dir.path()))
        .callback(Producer)
        .callback(InferenceRunner::new(val_flow(40, 20), infs))
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let events = report.monitors.backend::<TFEventWriter>().expect("writer");
    assert!(
        events.path().is_none(),
        "the writer is closed after training"
    );
    let file = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents."))
        })
        .expect("an events file in the logdir");
    let out = run_python(READ_EVENTS, &[file.to_str().expect("utf-8 path")]);
    let read: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    // Every scalar the monitors recorded is in the file with the same steps and f32 values.
    for name in [
        "step_value",
        "validation_error",
        "cross_entropy_loss",
        "train_error",
    ] {
        let history = report.history(name);
        assert!(!history.is_empty(), "{name}");
        let got = read["scalars"][name]
            .as_array()
            .unwrap_or_else(|| panic!("{name} in {read}"));
        assert_eq!(got.len(), history.len(), "{name}");
        for (g, (step, value)) in got.iter().zip(history) {
            assert_eq!(g[0].as_u64(), Some(*step));
            assert_eq!(
                g[1].as_f64().expect("value") as f32,
                *value as f32,
                "{name}"
            );
        }
    }
    assert_eq!(
        read["histograms"]["fc0/W"],
        serde_json::json!([[3, 784.0 * 32.0], [6, 784.0 * 32.0]])
    );
    assert_eq!(
        read["images"]["sample"],
        serde_json::json!([[3, 6, 4], [6, 6, 4]])
    );
}

#[test]
fn stats_json_has_a_record_per_flush_and_appends_only_to_its_predecessor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |starting_epoch: u64, epochs: u64| {
        let c = bare(config(
            mlp_model(0.1),
            train_flow(96, 32, 1),
            Some(dir.path()),
        ))
        .callback(ScriptedStat::new("val", &[0.5, 0.4, 0.3, 0.2, 0.1]))
        .callback(ScheduledHyperParamSetter::new("learning_rate", &[(2, 0.05)]).step_based())
        .monitors(vec![Box::new(JSONWriter::new())])
        .starting_epoch(starting_epoch)
        .max_epoch(starting_epoch + epochs - 1);
        launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train")
    };
    let report = run(1, 2);
    let records = load_existing_json(dir.path())
        .expect("read")
        .expect("exists");
    // The learning rate change after step 2 is flushed at that step; each epoch flushes too.
    let stamps: Vec<(u64, u64)> = records
        .iter()
        .map(|r| (r.epoch_num, r.global_step))
        .collect();
    assert_eq!(stamps, [(1, 2), (1, 3), (2, 6)]);
    assert_eq!(records[0].scalars["learning_rate"] as f32, 0.05);
    assert_eq!(records[1].scalars["val"], 0.5);
    assert_eq!(records[2].scalars["val"], 0.4);
    assert_eq!(
        report
            .monitors
            .backend::<JSONWriter>()
            .expect("json")
            .records()
            .len(),
        3
    );

    // Epoch 3 continues epoch 2: appended (a fresh run: its step counter restarts, so the
    // step-based setter fires again, as in tensorpack without a session_init).
    run(3, 1);
    let records = load_existing_json(dir.path())
        .expect("read")
        .expect("exists");
    let stamps: Vec<(u64, u64)> = records
        .iter()
        .map(|r| (r.epoch_num, r.global_step))
        .collect();
    assert_eq!(stamps, [(1, 2), (1, 3), (2, 6), (3, 2), (3, 3)]);
    assert_eq!(records[4].scalars["val"], 0.3);

    // Starting over at epoch 1 does not continue it: the old file is backed up.
    run(1, 1);
    let records = load_existing_json(dir.path())
        .expect("read")
        .expect("exists");
    assert_eq!(records.len(), 2);
    let backups = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("stats.json."))
        .count();
    assert_eq!(backups, 1);
}

#[test]
fn scalar_printer_prints_sorted_filtered_scalars_each_epoch() {
    let printer = ScalarPrinter::new().blacklist(&["^train_"]).expect("regex");
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .callback(ScriptedStat::new("val", &[0.123456789, 12345.678]))
        .callback(MovingAverageSummary::new())
        .monitors(vec![Box::new(printer)])
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let printed = report
        .monitors
        .backend::<ScalarPrinter>()
        .expect("printer")
        .printed()
        .to_vec();
    let names: Vec<&str> = printed
        .iter()
        .map(|l| l.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "cross_entropy_loss",
            "val",
            "wd_cost",
            "cross_entropy_loss",
            "val",
            "wd_cost"
        ]
    );
    assert_eq!(printed[1], "val: 0.12346");
    assert_eq!(printed[4], "val: 12346");

    let printer = ScalarPrinter::new().whitelist(&["^val$"]).expect("regex");
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .callback(ScriptedStat::new("val", &[1.5]))
        .callback(MovingAverageSummary::new())
        .monitors(vec![Box::new(printer)])
        .max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let printed = report
        .monitors
        .backend::<ScalarPrinter>()
        .expect("printer")
        .printed()
        .to_vec();
    assert_eq!(printed, ["val: 1.5"]);
}

#[test]
fn history_is_stamped_with_global_steps_and_strips_tower_prefixes() {
    let c = bare(config(mlp_model(0.1), train_flow(96, 32, 1), None))
        .callback(Producer)
        .callback(CallbackFactory::new("reader").on_trigger(|ctx| {
            let latest = ctx
                .monitors()
                .get_latest("step_value")
                .expect("put every step");
            assert_eq!(latest, ctx.global_step() as f64 * 0.5);
            assert!(ctx.monitors().get_latest("tower0/step_value").is_none());
            Ok(())
        }))
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let history = report.history("step_value");
    assert_eq!(
        history,
        (1..=6)
            .map(|g| (g, g as f64 * 0.5))
            .collect::<Vec<_>>()
            .as_slice()
    );
    assert!(
        report
            .monitors
            .scalar_names()
            .contains(&"step_value".to_string())
    );
}

#[test]
fn file_monitors_without_a_logdir_write_nothing() {
    let cwd_files = || std::fs::read_dir(".").expect("cwd").count();
    let before = cwd_files();
    let c = config(mlp_model(0.1), train_flow(64, 32, 1), None).max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert!(
        report
            .monitors
            .backend::<JSONWriter>()
            .expect("json")
            .records()
            .is_empty()
    );
    assert_eq!(cwd_files(), before);
}

#[test]
fn the_learning_rate_is_in_every_epoch_record_without_a_setter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = config(mlp_model(0.1), train_flow(96, 32, 1), Some(dir.path()))
        .monitors(vec![Box::new(JSONWriter::new())])
        .max_epoch(3);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let records = load_existing_json(dir.path())
        .expect("read")
        .expect("exists");
    let epochs: Vec<u64> = records.iter().map(|r| r.epoch_num).collect();
    assert_eq!(epochs, [1, 2, 3]);
    for r in &records {
        let lr = r.scalars.get("learning_rate").copied();
        assert_eq!(lr.map(|v| v as f32), Some(0.1), "epoch {}", r.epoch_num);
    }
}
