//! Lowering as a pipeline of named passes: every example program lowers with the IR checked
//! after every pass; a pass that breaks the IR is named by the check after it; users can add
//! their own passes; and `towerpack lower` prints the IR after each pass of the ResNet-20
//! training graph's text, with each pass's time.

use crate::model_steps;

use std::process::Command;

use model_steps::{TrainGraph, convnet, mlp, resnet20, training_graph_with};
use towerpack::lower::pipeline::{Dce, Emit, Expand, Extract, Kernelize, Verify};
use towerpack::lower::{
    Dump, LowerError, LowerOptions, Lowered, Pass, PassContext, Pipeline, lower,
};
use towerpack::models::{Dcgan, Mlp};
use towerpack::optim::Optimizer;

fn verified_each(tg: &TrainGraph, batch: usize) -> towerpack::lower::PassReport {
    let options = LowerOptions::default();
    let mut p = Pipeline::standard(&options);
    p.verify_each = true;
    let (program, report) = p
        .run(&tg.graph, &tg.step, batch, &options)
        .unwrap_or_else(|e| panic!("{e}"));
    // The same program as `lower` makes.
    let plain = lower(&tg.graph, &tg.step, batch, &options).expect("lower");
    assert_eq!(program.to_string(), plain.to_string());
    report
}

#[test]
fn every_example_program_lowers_with_the_ir_checked_after_every_pass() {
    let m = Mlp {
        input_shape: vec![8, 8],
        hidden: vec![16],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    let gan = Dcgan::default();
    for (what, tg, batch) in [
        ("mlp", mlp(), 16),
        ("resnet20", resnet20(), 2),
        ("convnet", convnet(), 4),
        (
            "mlp adam",
            training_graph_with(Optimizer::adam(1e-3), m.inputs(), |x| m.build(x)),
            8,
        ),
        (
            "gan adam",
            training_graph_with(Optimizer::adam(2e-4), gan.inputs(), |x| gan.build(x)),
            4,
        ),
    ] {
        let report = verified_each(&tg, batch);
        let names: Vec<&str> = report.passes.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "extract",
                "expand",
                "fold",
                "cse",
                "dce",
                "kernelize",
                "fuse-updates",
                "fuse-all-reduces",
                "emit",
                "verify"
            ],
            "{what}"
        );
    }
}

/// A pass that breaks the kernels: the first kernel another one reads from is dropped.
struct DropAKernel;

impl Pass for DropAKernel {
    fn name(&self) -> &'static str {
        "drop-a-kernel"
    }

    fn run(&self, ir: Lowered, _: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let Lowered::Kernels(mut k) = ir else {
            return Err(LowerError::Pipeline("expected kernels".into()));
        };
        let read: Vec<_> = k
            .kernels
            .drafts
            .iter()
            .filter(|d| d.alive)
            .flat_map(|d| d.inputs.iter().map(|o| o.base))
            .collect();
        let victim = k
            .kernels
            .drafts
            .iter()
            .position(|d| d.alive && d.outputs.iter().any(|o| read.contains(o)));
        if let Some(i) = victim {
            k.kernels.drafts[i].alive = false;
        }
        Ok((Lowered::Kernels(k), Some(usize::from(victim.is_some()))))
    }
}

#[test]
fn a_pass_that_breaks_the_ir_is_named_by_the_check_after_it() {
    let tg = mlp();
    let options = LowerOptions::default();
    let mut p = Pipeline::new();
    p.push(Extract)
        .push(Expand)
        .push(Dce)
        .push(Kernelize)
        .push(DropAKernel)
        .push(Emit)
        .push(Verify);
    p.verify_each = true;
    let e = p
        .run(&tg.graph, &tg.step, 8, &options)
        .expect_err("the broken pipeline fails");
    let text = e.to_string();
    assert!(text.starts_with("after pass `drop-a-kernel`"), "{text}");
    assert!(text.contains("no live kernel computes"), "{text}");
}

/// A user's pass: counts the graph's nodes and changes nothing.
struct CountNodes;

impl Pass for CountNodes {
    fn name(&self) -> &'static str {
        "count-nodes"
    }

    fn counts(&self) -> &'static str {
        "nodes"
    }

    fn run(&self, ir: Lowered, _: &PassContext) -> Result<(Lowered, Option<usize>), LowerError> {
        let n = match &ir {
            Lowered::Graph(sg) => sg.graph.node_count(),
            _ => 0,
        };
        Ok((ir, Some(n)))
    }
}

#[test]
fn users_add_their_own_passes_and_dump_the_ir_after_them() {
    let tg = mlp();
    let options = LowerOptions::default();
    let mut p = Pipeline::new();
    p.push(Extract)
        .push(Expand)
        .push(Dce)
        .push(CountNodes)
        .push(Kernelize)
        .push(Emit)
        .push(Verify);
    p.dump = Dump::After(vec!["count-nodes".into(), "kernelize".into()]);
    let (program, report) = p.run(&tg.graph, &tg.step, 8, &options).expect("lower");
    assert!(!program.kernels.is_empty());
    let count = &report.passes[3];
    assert_eq!(count.name, "count-nodes");
    let (nodes, unit) = count.count.expect("counted");
    assert_eq!(unit, "nodes");
    assert!(nodes > 10 && nodes <= tg.graph.node_count());
    // The graph printed after `count-nodes` is textual IR that parses back.
    let text = count.dump.as_ref().expect("dumped");
    let parsed = towerpack::ir::text::parse(text, "after count-nodes").expect("parses");
    assert_eq!(parsed.node_count(), nodes);
    let kernels = report.passes[4].dump.as_ref().expect("dumped");
    assert!(kernels.lines().any(|l| l.starts_with("d0 ")), "{kernels}");
    assert!(report.passes[5].dump.is_none());
}

#[test]
fn towerpack_lower_prints_the_ir_after_every_pass_of_resnet20_and_times_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("resnet20.tp");
    let tg = resnet20();
    std::fs::write(&file, towerpack::ir::text::print(&tg.graph)).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_towerpack"))
        .arg("lower")
        .arg(&file)
        .args(["--batch", "8", "--print-after-all", "--time-passes"])
        .output()
        .expect("towerpack runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let passes = [
        "extract",
        "expand",
        "fold",
        "cse",
        "dce",
        "kernelize",
        "fuse-updates",
        "fuse-all-reduces",
        "emit",
        "verify",
    ];
    for pass in passes {
        assert!(
            stdout.contains(&format!("// ----- IR after `{pass}` -----")),
            "no dump after {pass}"
        );
        assert!(
            stderr
                .lines()
                .any(|l| l.trim_start().starts_with(pass) && l.contains(" ms")),
            "no time for {pass}:\n{stderr}"
        );
    }
    // The graph passes print textual IR; the program comes last.
    assert!(
        stdout.contains("var @res1.0/conv1/W"),
        "textual IR after the graph passes"
    );
    assert!(stdout.contains("program: batch 8,"));
    assert!(stderr.lines().any(|l| l.trim_start().starts_with("total")));

    // Bad options are a usage error naming the option.
    let bad = Command::new(env!("CARGO_BIN_EXE_towerpack"))
        .arg("lower")
        .arg(&file)
        .args(["--fetch", "no/such/value"])
        .output()
        .expect("towerpack runs");
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no value named `no/such/value`"));
    let usage = Command::new(env!("CARGO_BIN_EXE_towerpack"))
        .arg("lower")
        .arg(&file)
        .args(["--print-afterall"])
        .output()
        .expect("towerpack runs");
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("unknown option `--print-afterall`"));
}
