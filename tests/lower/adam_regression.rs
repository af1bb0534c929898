//! Issue 20's regression: Adam's fused update read a gradient-arena member whose producer had
//! been redirected into a variable's storage (an in-place assign of the `v` slot's new value),
//! so part of the arena was never written and the update went wrong (the GAN to NaN at its
//! second step). The reduced case — a one-layer tanh generator with the GAN's losses and Adam —
//! and an Adam MLP train four steps on the CPU backend and on the emulated CUDA device, with
//! scratch poisoned before every step, and end where the reference executor does:
//! `|x − ref| ≤ 1e-4·max(|ref|, 1e-3)` per tensor, costs at every step likewise.

use crate::cuda_common;

use cuda_common::{TrainGraph, feeds, training_graph_with};
use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::poison::PoisonScratch;
use towerpack::backend::reference::ReferenceSession;
use towerpack::dsl::prelude::*;
use towerpack::graph;
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;

fn assert_close(what: &str, got: &HostTensor, want: &HostTensor) {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * scale,
            "{what}[{i}]: {a} vs reference {b} (scale {scale})"
        );
    }
}

fn compare(what: &str, tg: &TrainGraph, session: &mut dyn Session, batch: usize) {
    let mut reference = ReferenceSession::new(tg.graph.clone()).expect("reference");
    reference.initialize_variables(5).expect("init");
    session.initialize_variables(5).expect("init");
    for s in 0..4 {
        let f = feeds(tg, batch, s);
        let want = reference.run(&tg.step, &f).expect("reference step");
        let got = session.run(&tg.step, &f).expect("compiled step");
        assert_close(&format!("{what}: step {s} cost"), &got[0], &want[0]);
    }
    for (id, def) in tg.graph.variable_ids() {
        let (g, w) = (
            session.read_variable(id).expect("read"),
            reference.read_variable(id).expect("read"),
        );
        assert_close(&format!("{what}: {}", def.name), &g, &w);
    }
}

/// The reduced GAN: a one-layer tanh generator, a one-layer discriminator on real and
/// generated vectors, the non-saturating generator loss.
fn reduced_gan() -> TrainGraph {
    let signature = vec![
        InputSpec::new("real", DType::F32, Shape::batched(&[12])),
        InputSpec::new("z", DType::F32, Shape::batched(&[6])),
    ];
    training_graph_with(Optimizer::adam(2e-4), signature, |x| {
        let scaled = &x[0] * (1.0 / 255.0);
        let z = &x[1] * (1.0 / 255.0);
        let fake = graph! {
            scope "gen" {
                FullyConnected("fc0", &z, units = 12, activation = tanh)
            }
        };
        let discriminator = |image: &Tensor, reuse: bool| {
            let _scope = variable_scope_with_reuse("discrim", reuse);
            graph! { FullyConnected("fc", image, units = 1) }
        };
        let real_logit = discriminator(&scaled, false);
        let fake_logit = discriminator(&fake, true);
        let ones = real_logit.scalar_like(1.0);
        let zeros = real_logit.scalar_like(0.0);
        let d_loss = sigmoid_cross_entropy_with_logits(&real_logit, &ones).mean()
            + sigmoid_cross_entropy_with_logits(&fake_logit, &zeros).mean();
        let g_loss = sigmoid_cross_entropy_with_logits(&fake_logit, &ones).mean();
        d_loss + g_loss
    })
}

fn adam_mlp() -> TrainGraph {
    let m = Mlp {
        input_shape: vec![8, 8],
        hidden: vec![32, 16],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    training_graph_with(Optimizer::adam(1e-3), m.inputs(), |x| m.build(x))
}

fn cpu(tg: &TrainGraph) -> CpuSession {
    CpuSession::new(
        tg.graph.clone(),
        CpuOptions {
            poison_scratch: PoisonScratch::EveryStep,
            ..CpuOptions::default()
        },
    )
    .expect("cpu")
}

fn emulated(tg: &TrainGraph) -> CudaSession {
    cuda_common::require_nvrtc();
    let options = CudaOptions {
        cache_dir: None,
        ..CudaOptions::default()
    };
    CudaSession::emulated(tg.graph.clone(), 1, options).expect("emulated session")
}

#[test]
fn the_reduced_gan_with_adam_matches_the_reference_on_the_cpu() {
    let tg = reduced_gan();
    compare("reduced gan (cpu)", &tg, &mut cpu(&tg), 8);
}

#[test]
fn the_reduced_gan_with_adam_matches_the_reference_on_the_emulated_device() {
    let tg = reduced_gan();
    compare("reduced gan (cuda-emu)", &tg, &mut emulated(&tg), 8);
}

#[test]
fn an_adam_mlp_matches_the_reference_on_the_cpu_and_the_emulated_device() {
    let tg = adam_mlp();
    compare("adam mlp (cpu)", &tg, &mut cpu(&tg), 8);
    compare("adam mlp (cuda-emu)", &tg, &mut emulated(&tg), 8);
}
