//! Activations stored in bf16 (`lower::half_storage`, `LowerOptions::half_activations`): which
//! values the pass picks, and that the CPU backend computes what the reference executor does
//! with those values rounded to bf16 (`half_storage::round_values`).

use crate::model_steps::{TrainGraph, training_graph};
use crate::training::{costs_and_variables, max_relative};
use towerpack::backend::Session;
use towerpack::backend::cpu::kernels::SimdLevel;
use towerpack::backend::cpu::{AmxUse, CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::dsl::prelude::*;
use towerpack::graph;
use towerpack::lower::{
    KernelKind, LowerOptions, Precision, Program, autocast, half_storage, lower,
};
use towerpack::models::classification_loss;
use towerpack::tensor::{DType, HostTensor};

const BATCH: usize = 8;

/// A residual network without batch norm (whose statistics make steps too ill-conditioned to
/// compare across executors, see `training::bf16_and_fp16_training_steps_match_the_reference`):
/// 16×16×8 images, three 3×3 convolutions of 16 channels, a residual add, global pooling.
fn residual_net() -> TrainGraph {
    let signature = vec![
        InputSpec::new("input", DType::F32, Shape::batched(&[16, 16, 8])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
    ];
    training_graph(signature, |x| {
        let (image, label) = (&x[0], &x[1]);
        let logits = graph! {
            argscope Conv2D(kernel_size = 3, use_bias = false) {
                let c0 = Conv2D("conv0", image, filters = 16, activation = relu);
                let c1 = Conv2D("conv1", &c0, filters = 16, activation = relu);
                let c2 = Conv2D("conv2", c1, filters = 16);
                let l = relu(&(c2 + &c0));
                let l = GlobalAvgPooling("gap", l);
                FullyConnected("linear", l, units = 10)
            }
        };
        classification_loss(&logits, label)
    })
}

fn bf16_program(tg: &TrainGraph, half_activations: bool) -> Program {
    let options = LowerOptions {
        precision: Precision::Bf16,
        half_activations,
        ..LowerOptions::default()
    };
    lower(&tg.graph, &tg.step, BATCH, &options).expect("lower")
}

/// The names of the values `p` stores in bf16.
fn stored_in_bf16(p: &Program) -> Vec<String> {
    let mut names: Vec<String> = p
        .buffers
        .iter()
        .filter(|b| b.dtype == DType::BF16)
        .map(|b| b.name.clone())
        .collect();
    names.sort();
    names
}

/// The cost of 3 steps and every variable after them: on the CPU backend (bf16, activations
/// stored as `half_activations` says), or on the reference executor running the graph with the
/// autocast pass's casts and the values `rounded` read through bf16 round trips.
fn run(tg: &TrainGraph, cpu: Option<(bool, CpuOptions)>, rounded: &[String]) -> Vec<HostTensor> {
    let mut session: Box<dyn Session> = match cpu {
        Some((half_activations, options)) => Box::new(
            CpuSession::new(
                tg.graph.clone(),
                CpuOptions {
                    lower: LowerOptions {
                        precision: Precision::Bf16,
                        half_activations,
                        ..LowerOptions::default()
                    },
                    ..options
                },
            )
            .expect("cpu"),
        ),
        None => {
            let mut g = tg.graph.clone();
            autocast::insert_casts(&mut g, towerpack::lower::HalfFormat::Bf16).expect("casts");
            let values: Vec<_> = rounded
                .iter()
                .map(|name| {
                    g.find_value(name)
                        .unwrap_or_else(|| panic!("`{name}` is not a value of the graph"))
                })
                .collect();
            half_storage::round_values(&mut g, &values).expect("round trips");
            Box::new(ReferenceSession::new(g).expect("reference"))
        }
    };
    costs_and_variables(session.as_mut(), tg, BATCH, 3)
}

/// The pass stores the convolutions' activations (read only by fused expressions and as
/// convolution inputs); what a convolution's gradient reads as `dy`, the logits and the
/// variables stay f32, and the program has the same kernels and a smaller peak.
#[test]
fn bf16_programs_store_the_convolutions_activations_in_bf16() {
    let tg = residual_net();
    let half = bf16_program(&tg, true);
    let names = stored_in_bf16(&half);
    eprintln!("stored in bf16: {names:?}");
    // The activations after each ReLU epilogue and the residual sum's ReLU; the gradients
    // flowing back are read as `dy` by the convolutions' gradients, so they stay f32.
    assert_eq!(names, ["Relu", "conv0/Relu", "conv1/Relu"]);
    for b in half.buffers.iter().filter(|b| b.dtype == DType::BF16) {
        assert!(
            b.len() >= half_storage::MIN_ELEMENTS,
            "{}: {:?}",
            b.name,
            b.shape
        );
        assert!(
            matches!(b.storage, towerpack::lower::Storage::Scratch { .. }),
            "{} is not scratch",
            b.name
        );
    }
    let full = bf16_program(&tg, false);
    assert!(stored_in_bf16(&full).is_empty());
    assert_eq!(
        half.kernels.len(),
        full.kernels.len(),
        "no kernel of its own"
    );
    assert!(
        half.peak_bytes() < full.peak_bytes(),
        "peak {} vs {}",
        half.peak_bytes(),
        full.peak_bytes()
    );
}

/// `LowerOptions::half_gradients` (the CUDA backend's) also stores in bf16 the gradients the
/// convolutions' gradients read as `dy`, and keeps everything `half_activations` stores; the
/// CPU backend, whose convolutions read `dy` in f32 only, refuses it with an error naming it.
#[test]
fn half_gradients_store_what_convolution_gradients_read_as_dy_and_the_cpu_refuses_them() {
    let tg = residual_net();
    let activations = bf16_program(&tg, true);
    let options = LowerOptions {
        precision: Precision::Bf16,
        half_gradients: true,
        ..LowerOptions::default()
    };
    let gradients = lower(&tg.graph, &tg.step, BATCH, &options).expect("lower");
    let (a, g) = (stored_in_bf16(&activations), stored_in_bf16(&gradients));
    eprintln!("stored in bf16 with half_gradients: {g:?}");
    assert!(a.iter().all(|n| g.contains(n)), "{a:?} not all in {g:?}");
    let dy_in_bf16 = |p: &Program| -> Vec<String> {
        p.kernels
            .iter()
            .filter_map(|k| match k.kind {
                KernelKind::Conv2dBackpropInput(..) => Some((k, 0)),
                KernelKind::Conv2dBackpropFilter(..) => Some((k, 1)),
                _ => None,
            })
            .filter(|(k, slot)| p.buffer(k.inputs[*slot].buffer).dtype == DType::BF16)
            .map(|(k, _)| k.name.clone())
            .collect()
    };
    assert!(dy_in_bf16(&activations).is_empty());
    // The gradients flowing back into the three convolutions: their filter gradients and the
    // input gradients of conv1 and conv2 read them as dy.
    let read = dy_in_bf16(&gradients);
    eprintln!("convolution gradients reading dy in bf16: {read:?}");
    assert_eq!(read.len(), 5, "{read:?}");
    let cpu = CpuSession::new(
        tg.graph.clone(),
        CpuOptions {
            lower: options,
            ..CpuOptions::default()
        },
    );
    match cpu {
        Err(e) => assert!(e.to_string().contains("half_gradients"), "{e}"),
        Ok(_) => panic!("the CPU backend took half_gradients"),
    }
}

/// The CPU's bf16 steps with activations stored in bf16 compute what the reference executor
/// does with those values rounded (their round trips inserted in the graph), within one bf16
/// ulp of each tensor's scale (products of bf16 operands are exact; the executors sum in
/// different orders, so a value 1 f32 ulp apart can round to the neighbouring bf16 value).
/// Without the round trips the reference is further away: the storage is not f32. On every
/// SIMD level this CPU runs, with and without AMX tiles (convolutions read and write bf16
/// activations through the same adapters whatever kernel runs).
#[test]
fn bf16_activations_match_the_reference_with_their_round_trips() {
    let tg = residual_net();
    let names = stored_in_bf16(&bf16_program(&tg, true));
    let reference = run(&tg, None, &names);
    let unrounded = run(&tg, None, &[]);
    for simd in SimdLevel::ALL
        .into_iter()
        .filter(|&l| l <= SimdLevel::max())
    {
        for amx in [AmxUse::Off, AmxUse::Auto] {
            let options = CpuOptions {
                simd: Some(simd),
                amx,
                ..CpuOptions::default()
            };
            let cpu = run(&tg, Some((true, options)), &names);
            let cpu_f32_storage = run(&tg, Some((false, options)), &names);
            let d = max_relative(&cpu, &reference);
            let d_unrounded = max_relative(&cpu, &unrounded);
            let d_f32 = max_relative(&cpu_f32_storage, &reference);
            eprintln!(
                "{simd:?} {amx:?}: bf16 activations vs reference {d:.1e}, vs reference without \
                 their round trips {d_unrounded:.1e}; f32 activations vs the reference with \
                 them {d_f32:.1e}"
            );
            assert!(d <= 2f64.powi(-8), "{simd:?} {amx:?}: {d}");
            assert!(d_unrounded > 5.0 * d.max(1e-7), "{d_unrounded} vs {d}");
            assert!(d_f32 > 5.0 * d.max(1e-7), "{d_f32} vs {d}");
        }
    }
}
