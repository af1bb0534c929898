//! ONNX export checked against onnxruntime. Each model is trained a few steps (the GAN's
//! generator gets random weights and BatchNorm statistics instead), exported from its
//! checkpoint with `towerpack::export::onnx`, checked by `onnx.checker.check_model(full_check)`
//! and run by onnxruntime (`tests/onnx_runtime.py`, spawned; `cargo xtask test` brings the
//! Python packages) on 256 random inputs, on the 2,000 held-out digits where the model reads
//! digits, and on batches of 1 and 37 (the batch dimension is symbolic, `N`).
//!
//! The bound: for every output, `max |onnxruntime − towerpack| ≤ 1e-5 · max |towerpack|`, where
//! towerpack is the `OfflinePredictor` on the CPU backend restored from the same checkpoint.
//! Measured differences are printed (`cargo test --release --test export_onnx -- --nocapture`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::data::{BatchData, LabeledImages, mnist10k_split};
use towerpack::dsl::prelude::*;
use towerpack::export::onnx::{OPSET, OnnxError, OnnxExport, pb};
use towerpack::graph;
use towerpack::models::{CifarResNet, ConvNet, Dcgan, Mlp, generator};
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::ModelSaver;
use towerpack::train::checkpoint::{load_checkpoint, save_checkpoint};
use towerpack::train::{
    BackendChoice, ModelDesc, ModelFn, OfflinePredictor, PredictConfig, SaverRestore,
    SimpleTrainer, TrainConfig, launch_train_with_config,
};

/// The relative bound of every comparison (see the module doc).
const REL: f64 = 1e-5;

fn cpu() -> BackendChoice {
    BackendChoice::Cpu { threads: 2 }
}

/// Rows `start..start + count` of a batched `f32` tensor.
fn rows(t: &HostTensor, start: usize, count: usize) -> HostTensor {
    let shape = t.shape();
    let per: usize = shape[1..].iter().product();
    let data = t.as_f32().expect("f32")[start * per..(start + count) * per].to_vec();
    let mut dims = shape.to_vec();
    dims[0] = count;
    HostTensor::from_f32(&dims, data).expect("rows")
}

/// `n` examples of shape `dims`, uniform in `[low, high)`.
fn uniform(seed: u64, n: usize, dims: &[usize], low: f32, high: f32) -> HostTensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut shape = vec![n];
    shape.extend_from_slice(dims);
    let len: usize = shape.iter().product();
    let data = (0..len).map(|_| rng.random_range(low..high)).collect();
    HostTensor::from_f32(&shape, data).expect("uniform")
}

/// onnxruntime's outputs of one model on several batches.
struct OrtRun {
    report: serde_json::Value,
    /// Per batch, per output: the values.
    outputs: Vec<Vec<Vec<f32>>>,
}

/// Checks and runs `model` with onnxruntime on each batch (fed to the input `input`).
fn onnxruntime(model: &Path, input: &str, batches: &[HostTensor]) -> OrtRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut runs = Vec::new();
    for (i, batch) in batches.iter().enumerate() {
        let file = dir.path().join(format!("in{i}.bin"));
        std::fs::write(&file, batch.to_le_bytes()).expect("write input");
        let out_dir = dir.path().join(format!("out{i}"));
        std::fs::create_dir(&out_dir).expect("out dir");
        runs.push(serde_json::json!({
            "inputs": { input: { "file": file, "dtype": "float32", "shape": batch.shape() } },
            "out_dir": out_dir,
        }));
    }
    let report_path = dir.path().join("report.json");
    let request = serde_json::json!({ "model": model, "report": report_path, "runs": runs });
    let request_path = dir.path().join("request.json");
    std::fs::write(&request_path, request.to_string()).expect("write request");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx_runtime.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&request_path)
        .output()
        .expect("python3 runs (install Python 3 with `pip install onnx onnxruntime`)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.code() != Some(2),
        "{text}\nthe ONNX tests need Python's onnx and onnxruntime: run the tests with `cargo xtask test`, which brings them"
    );
    assert!(
        out.status.success(),
        "onnx check or onnxruntime failed:\n{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report"))
            .expect("report json");
    let outputs = (0..batches.len())
        .map(|i| {
            let n = report["runs"][i]["outputs"]
                .as_array()
                .expect("outputs")
                .len();
            (0..n)
                .map(|j| {
                    let bytes = std::fs::read(dir.path().join(format!("out{i}/{j}.bin")))
                        .expect("output file");
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                })
                .collect()
        })
        .collect();
    OrtRun { report, outputs }
}

/// The predictor's output on `batch`, run in chunks of at most 500.
fn predict(p: &mut OfflinePredictor, batch: &HostTensor) -> Vec<f32> {
    let n = batch.shape()[0];
    let mut out = Vec::new();
    for start in (0..n).step_by(500) {
        let chunk = rows(batch, start, 500.min(n - start));
        out.extend(p.predict(&[chunk]).expect("predict")[0].to_f32_vec());
    }
    out
}

/// Asserts `max |ours − ort| ≤ REL · max |ours|`; returns `(max diff, max |ours|)`.
fn compare(what: &str, ours: &[f32], ort: &[f32]) -> (f64, f64) {
    assert_eq!(ours.len(), ort.len(), "{what}: output sizes differ");
    let scale = ours.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
    let diff = ours.iter().zip(ort).fold(0f64, |m, (&a, &b)| {
        m.max((f64::from(a) - f64::from(b)).abs())
    });
    assert!(
        scale > 0.0,
        "{what}: all outputs are zero, nothing is compared"
    );
    assert!(
        diff <= REL * scale,
        "{what}: max |onnxruntime − towerpack| = {diff:e} exceeds {REL:e} · max|towerpack| = {:e}",
        REL * scale
    );
    (diff, scale)
}

/// Transpose nodes of `model` that move activations (their input is not an initializer).
fn activation_transposes(model: &pb::ModelProto) -> usize {
    let g = model.graph.as_ref().expect("graph");
    let constants: std::collections::HashSet<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    g.node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some("Transpose"))
        .filter(|n| !constants.contains(n.input[0].as_str()))
        .count()
}

/// One model to check: what to export and predict, and the batches to compare on.
struct Case<'a> {
    name: &'a str,
    model: Arc<dyn ModelDesc>,
    export: OnnxExport,
    output: &'a str,
    /// Checkpoint file or directory.
    checkpoint: &'a Path,
    random: HostTensor,
    held_out: Option<HostTensor>,
    /// Expected activation transposes (one in, one out at most).
    transposes: usize,
}

/// Exports, checks, runs and compares one case; prints the measured differences.
fn check(case: Case) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.onnx", case.name));
    let report = case.export.write(case.checkpoint, &path).expect("export");
    assert_eq!(report.inputs, ["input"]);
    assert_eq!(report.outputs, [case.output]);

    // The structure: tensorpack's variable names as initializers, transposes folded.
    let ckpt = load_checkpoint(case.checkpoint).expect("checkpoint");
    let exported = case.export.export(&ckpt.tensors).expect("export");
    let g = exported.model.graph.as_ref().expect("graph");
    for init in &g.initializer {
        let name = init.name.as_deref().expect("name");
        if let Some(value) = ckpt.tensors.get(name) {
            assert_eq!(
                init.raw_data.as_deref(),
                Some(value.to_le_bytes().as_slice())
            );
        }
    }
    let variables = g
        .initializer
        .iter()
        .filter(|t| ckpt.tensors.contains_key(t.name.as_deref().unwrap_or("")))
        .count();
    assert!(variables > 0, "no variable initializer");
    assert_eq!(
        activation_transposes(&exported.model),
        case.transposes,
        "{}: activation transposes",
        case.name
    );

    let mut batches = vec![case.random.clone()];
    batches.extend(case.held_out.clone());
    batches.push(rows(&case.random, 0, 1));
    batches.push(rows(&case.random, 1, 37));
    let ort = onnxruntime(&path, "input", &batches);
    assert_eq!(ort.report["opsets"][""], OPSET);
    assert_eq!(ort.report["inputs"]["input"][0], "N", "{}", ort.report);
    assert_eq!(ort.report["outputs"][case.output][0], "N", "{}", ort.report);

    let mut predictor = OfflinePredictor::new(
        PredictConfig::new(Arc::clone(&case.model), &[case.output])
            .input_names(&["input"])
            .session_init(SaverRestore::new(case.checkpoint))
            .backend(cpu()),
    )
    .expect("predictor");
    let labels = ["random", "held-out", "batch 1", "batch 37"];
    let labels: Vec<&str> = if case.held_out.is_some() {
        labels.to_vec()
    } else {
        vec![labels[0], labels[2], labels[3]]
    };
    for ((batch, ort_out), label) in batches.iter().zip(&ort.outputs).zip(labels) {
        let ours = predict(&mut predictor, batch);
        let n = batch.shape()[0];
        assert_eq!(ort.outputs.len(), batches.len());
        let (diff, scale) = compare(&format!("{} {label}", case.name), &ours, &ort_out[0]);
        println!(
            "{}: {label} (batch {n}): max |onnxruntime − towerpack| = {diff:.3e}, max |towerpack| \
             = {scale:.3e}, ratio {:.2e} (bound {REL:e})",
            case.name,
            diff / scale
        );
    }
}

/// Trains `model` `steps` steps at batch 16 on `data`, checkpointing into `dir`.
fn train(model: ModelFn, data: &LabeledImages, steps: u64, dir: &Path) {
    let flow = BatchData::new(data.to_flow(Some(1)).expect("flow"), 16, false).expect("batch");
    let config = TrainConfig::new(model)
        .dataflow(flow)
        .callback(ModelSaver::new())
        .backend(cpu())
        .logdir(dir)
        .max_epoch(1)
        .steps_per_epoch(steps)
        .seed(3);
    launch_train_with_config(config, &mut SimpleTrainer::new()).expect("train");
}

fn mnist_digits() -> (LabeledImages, LabeledImages) {
    let split = mnist10k_split().expect("digits");
    (
        split
            .train
            .slice(0, 256)
            .expect("slice")
            .to_f32(1.0 / 255.0),
        split.validation.to_f32(1.0 / 255.0),
    )
}

fn classifier(
    inputs: Vec<InputSpec>,
    tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
) -> ModelFn {
    ModelFn::new(inputs, tower, Optimizer::momentum(0.05, 0.9))
}

#[test]
fn mnist_mlp_matches_onnxruntime() {
    let (train_set, held_out) = mnist_digits();
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![256],
        ..Mlp::default()
    };
    let model = classifier(mlp.inputs(), move |x| mlp.build(x));
    let dir = tempfile::tempdir().expect("tempdir");
    train(model.clone(), &train_set, 4, dir.path());
    let model: Arc<dyn ModelDesc> = Arc::new(model);
    check(Case {
        name: "mlp",
        export: OnnxExport::new(Arc::clone(&model), &["linear/output"])
            .input_names(&["input"])
            .require_all_variables(),
        model,
        output: "linear/output",
        checkpoint: dir.path(),
        random: uniform(11, 256, &[28, 28, 1], 0.0, 1.0),
        held_out: Some(held_out.images().clone()),
        transposes: 0,
    });
}

#[test]
fn mnist_convnet_matches_onnxruntime() {
    let (train_set, held_out) = mnist_digits();
    let net = ConvNet {
        dropout_rate: 0.25,
        ..ConvNet::default()
    };
    let model = classifier(net.inputs(), move |x| net.build(x));
    let dir = tempfile::tempdir().expect("tempdir");
    train(model.clone(), &train_set, 4, dir.path());
    let model: Arc<dyn ModelDesc> = Arc::new(model);
    check(Case {
        name: "convnet",
        // Default inputs: those the logits need (the image, not the label).
        export: OnnxExport::new(Arc::clone(&model), &["linear/output"]).require_all_variables(),
        model,
        output: "linear/output",
        checkpoint: dir.path(),
        random: uniform(12, 256, &[28, 28, 1], 0.0, 1.0),
        held_out: Some(held_out.images().clone()),
        // Into NCHW before conv0, back before fc0's flattening reshape.
        transposes: 2,
    });
}

#[test]
fn resnet20_matches_onnxruntime() {
    // The resnet example's input: digits padded to 32×32×3, the training mean subtracted.
    let split = mnist10k_split().expect("digits");
    let train_set = split.train.pad_and_replicate(2, 3).expect("pad");
    let mean = train_set.mean_image().expect("mean");
    let train_set = train_set
        .slice(0, 128)
        .expect("slice")
        .subtract_image(&mean)
        .expect("mean");
    let held_out = split
        .validation
        .pad_and_replicate(2, 3)
        .expect("pad")
        .subtract_image(&mean)
        .expect("mean");
    let net = CifarResNet::new(3);
    let model = classifier(net.inputs(), move |x| net.build(x));
    let dir = tempfile::tempdir().expect("tempdir");
    train(model.clone(), &train_set, 3, dir.path());
    let model: Arc<dyn ModelDesc> = Arc::new(model);
    check(Case {
        name: "resnet20",
        export: OnnxExport::new(Arc::clone(&model), &["linear/output"])
            .input_names(&["input"])
            .require_all_variables(),
        model,
        output: "linear/output",
        checkpoint: dir.path(),
        random: uniform(13, 256, &[32, 32, 3], -128.0, 128.0),
        held_out: Some(held_out.images().clone()),
        // Into NCHW once; global average pooling leaves [N, C], which is plain again.
        transposes: 1,
    });
}

/// The generator's signature: the noise `[N, z_dim]` as `input`.
fn signature_of(z_dim: usize) -> Vec<InputSpec> {
    vec![InputSpec::new(
        "input",
        DType::F32,
        Shape::batched(&[z_dim]),
    )]
}

/// The generator's tower on `input` (the noise `z`), as a model the predictor can build.
fn generator_model(z_dim: usize) -> (Vec<InputSpec>, ModelFn) {
    let signature = vec![InputSpec::new(
        "input",
        DType::F32,
        Shape::batched(&[z_dim]),
    )];
    let model = ModelFn::new(
        signature.clone(),
        |x| generator(&x[0]),
        Optimizer::momentum(0.1, 0.9),
    );
    (signature, model)
}

#[test]
fn gan_generator_matches_onnxruntime() {
    let z_dim = Dcgan::default().z_dim;
    let (signature, model) = generator_model(z_dim);
    // Random weights and BatchNorm statistics far from their initial values (mean 0, variance
    // 1), so a swapped mean/variance or a missed channel broadcast shows.
    let builder = Builder::with_seed(0);
    builder
        .build_tower(TowerContext::inference("", ""), &signature, |x| {
            generator(&x[0])
        })
        .expect("tower");
    let graph = builder.finish().expect("graph");
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut tensors = Vec::new();
    for def in graph.variables() {
        let shape = def.ty.shape.to_static().expect("static");
        let len: usize = shape.iter().product();
        let (low, high) = if def.name.ends_with("variance/EMA") {
            (0.3, 2.0)
        } else if def.name.ends_with("gamma") {
            (0.5, 1.5)
        } else if def.name.ends_with("/W") {
            (-0.2, 0.2)
        } else {
            (-0.5, 0.5)
        };
        let data = (0..len).map(|_| rng.random_range(low..high)).collect();
        tensors.push((
            def.name.clone(),
            HostTensor::from_f32(&shape, data).expect("value"),
        ));
    }
    assert!(tensors.iter().any(|(n, _)| n == "gen/bn1/bn/mean/EMA"));
    // The discriminator's variables are in a GAN checkpoint too; the generator leaves them out.
    let extra = HostTensor::from_f32(&[2], vec![1.0, 2.0]).expect("extra");
    tensors.push(("discrim/fc/b".to_string(), extra));
    let dir = tempfile::tempdir().expect("tempdir");
    save_checkpoint(dir.path(), 1, &tensors, &BTreeMap::new()).expect("checkpoint");
    check(Case {
        name: "gan_generator",
        export: OnnxExport::from_tower(signature, |x| generator(&x[0]), &[]),
        model: Arc::new(model),
        output: "gen/deconv1/output",
        checkpoint: dir.path(),
        random: uniform(14, 256, &[z_dim], -1.0, 1.0),
        held_out: None,
        // Into NCHW before deconv0, back to NHWC for the output.
        transposes: 2,
    });

    // The variables left out are reported; an export that must read them all refuses.
    let out = dir.path().join("generator.onnx");
    let export = || OnnxExport::from_tower(signature_of(z_dim), |x| generator(&x[0]), &[]);
    let report = export().write(dir.path(), &out).expect("export");
    assert_eq!(report.left_out, ["discrim/fc/b"]);
    assert!(report.to_string().contains("discrim/fc/b"), "{report}");
    let err = export()
        .require_all_variables()
        .write(dir.path(), &out)
        .expect_err("an unread variable");
    assert!(
        matches!(err, OnnxError::UnreadVariables { count: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("discrim/fc/b"), "{err}");
}

#[test]
fn an_op_without_onnx_mapping_is_an_error_naming_the_node() {
    // Dropout forced on in the inference tower draws towerpack's counter-based random numbers.
    let signature = vec![InputSpec::new("input", DType::F32, Shape::batched(&[8]))];
    let export = OnnxExport::from_tower(
        signature,
        |x| {
            graph! {
                let l = FullyConnected("fc", &x[0], units = 4);
                Dropout("drop", l, rate = 0.5, training = true)
            }
        },
        &[],
    );
    let err = export.export(&BTreeMap::new()).expect_err("no mapping");
    let msg = err.to_string();
    match &err {
        OnnxError::Unsupported { node, op, .. } => {
            assert!(node.starts_with("drop/"), "{msg}");
            assert_eq!(op, "random_uniform", "{msg}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(
        msg.contains("random_uniform") && msg.contains("drop/"),
        "{msg}"
    );
    assert!(msg.contains("f32[N,4]"), "the input types are named: {msg}");

    // A loss is refused too, naming its node.
    let mlp = Mlp {
        input_shape: vec![8],
        hidden: vec![4],
        ..Mlp::default()
    };
    let model: Arc<dyn ModelDesc> = Arc::new(classifier(mlp.inputs(), move |x| mlp.build(x)));
    let err = OnnxExport::new(model, &["cross_entropy_loss"])
        .export(&BTreeMap::new())
        .expect_err("a loss");
    let msg = err.to_string();
    assert!(msg.contains("sparse_softmax_cross_entropy"), "{msg}");
}

/// `target/<profile>/examples/<name>`, built by `cargo test` before the tests.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples (or `cargo build --release --examples`)",
        path.display()
    );
    path
}

fn run_example(name: &str, args: &[&str]) -> String {
    let out = Command::new(example(name))
        .args(args)
        .output()
        .expect("example starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} {args:?}:\n{text}");
    text
}

#[test]
fn examples_export_with_the_export_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_string();

    // mnist: train two steps, export, compare with the predictor on the held-out digits.
    let log = p("mnist");
    let common = ["--threads", "2", "--logdir", &log];
    run_example(
        "mnist",
        &[
            &common[..],
            &[
                "--max-epoch",
                "1",
                "--steps-per-epoch",
                "2",
                "--val-images",
                "100",
            ],
        ]
        .concat(),
    );
    let file = p("mnist.onnx");
    let text = run_example(
        "mnist",
        &[&common[..], &["--export", &file, "--load", &log]].concat(),
    );
    assert!(text.contains("opset 17"), "{text}");
    let (_, held_out) = mnist_digits();
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![256],
        ..Mlp::default()
    };
    let mut predictor = OfflinePredictor::new(
        PredictConfig::new(
            Arc::new(classifier(mlp.inputs(), move |x| mlp.build(x))),
            &["linear/output"],
        )
        .input_names(&["input"])
        .session_init(SaverRestore::new(&log))
        .backend(cpu()),
    )
    .expect("predictor");
    let digits = rows(held_out.images(), 0, 300);
    let ort = onnxruntime(Path::new(&file), "input", std::slice::from_ref(&digits));
    let (diff, scale) = compare(
        "mnist example",
        &predict(&mut predictor, &digits),
        &ort.outputs[0][0],
    );
    println!("mnist example --export: max diff {diff:.3e}, max |towerpack| {scale:.3e}");

    // resnet (depth 8) and gan: train one step, export; the files pass the checker and run.
    let log = p("resnet");
    let common = [
        "--depth",
        "8",
        "--batch",
        "8",
        "--threads",
        "2",
        "--logdir",
        &log,
    ];
    run_example(
        "resnet",
        &[
            &common[..],
            &[
                "--max-epoch",
                "1",
                "--steps-per-epoch",
                "1",
                "--val-images",
                "16",
            ],
        ]
        .concat(),
    );
    let file = p("resnet.onnx");
    run_example(
        "resnet",
        &[&common[..], &["--export", &file, "--load", &log]].concat(),
    );
    let ort = onnxruntime(
        Path::new(&file),
        "input",
        &[uniform(3, 5, &[32, 32, 3], -1.0, 1.0)],
    );
    assert_eq!(ort.outputs[0][0].len(), 5 * 10);

    let log = p("gan");
    let common = ["--batch", "8", "--threads", "2", "--logdir", &log];
    run_example(
        "gan",
        &[&common[..], &["--max-epoch", "1", "--steps-per-epoch", "1"]].concat(),
    );
    let file = p("gan.onnx");
    run_example(
        "gan",
        &[&common[..], &["--export", &file, "--load", &log]].concat(),
    );
    let ort = onnxruntime(Path::new(&file), "z", &[uniform(4, 3, &[64], -1.0, 1.0)]);
    assert_eq!(ort.outputs[0][0].len(), 3 * 28 * 28);
    assert!(
        ort.outputs[0][0].iter().all(|x| (-1.0..=1.0).contains(x)),
        "tanh range"
    );
}
