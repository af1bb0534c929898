//! A custom trainer that overrides `run_step` to alternate two optimizers (tensorpack's
//! `SeparateGANTrainer`): a generator and a discriminator built from one tower, each minimized
//! by its own optimizer in its own hooked run.

use crate::train_common;

use std::sync::Arc;

use towerpack::data::DataFlow;
use towerpack::dsl::prelude::*;
use towerpack::ir::NodeId;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::*;
use train_common::*;

/// tensorpack's SeparateGANTrainer: a discriminator step every `d_period` global steps and a
/// generator step every `g_period`, each its own hooked run with its own optimizer.
struct SeparateGanTrainer {
    d_period: u64,
    g_period: u64,
    ops: Option<(NodeId, NodeId)>,
    runs: Vec<&'static str>,
}

fn gan_tower(x: &[Tensor]) -> Tensor {
    let (real, z) = (&x[0], &x[1]);
    let fake = {
        let _s = variable_scope("gen");
        FullyConnected("fc", z).units(4).build()
    };
    let d = |t: &Tensor| {
        let _s = variable_scope_with_reuse("discrim", current_builder_reuse());
        FullyConnected("fc", t).units(1).build()
    };
    let d_real = d(real);
    let d_fake = d(&fake);
    let d_loss = ((&d_real - 1.0) * (&d_real - 1.0)).mean() + (&d_fake * &d_fake).mean();
    d_loss.named("d_loss");
    ((&d_fake - 1.0) * (&d_fake - 1.0)).mean().named("g_loss")
}

/// Reuse the discriminator's variables once they exist.
fn current_builder_reuse() -> bool {
    towerpack::dsl::current_builder()
        .is_some_and(|b| b.with_graph(|g| g.find_variable("discrim/fc/W").is_some()))
}

impl Trainer for SeparateGanTrainer {
    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        let sig = vec![
            InputSpec::new("real", DType::F32, Shape::batched(&[4])),
            InputSpec::new("z", DType::F32, Shape::batched(&[2])),
        ];
        setup.input.setup(&sig)?;
        let tower = setup.with_builder(|b| {
            b.build_tower(TowerContext::training("", "", 0, 1), &sig, gan_tower)
        })??;
        setup.register_tower(&tower)?;
        let graph = &mut *setup.graph;
        let d_loss = graph.find_value("d_loss").expect("d_loss");
        let g_loss = tower.cost.expect("g_loss");
        let vars = |graph: &towerpack::ir::Graph, scope: &str| {
            tower
                .gradient_variables(graph)
                .into_iter()
                .filter(|&v| graph.variable(v).name.starts_with(scope))
                .collect::<Vec<_>>()
        };
        let (d_vars, g_vars) = (vars(graph, "discrim/"), vars(graph, "gen/"));
        let d_grads = towerpack::autodiff::gradients(graph, d_loss, &d_vars, "d_gradients")?;
        let g_grads = towerpack::autodiff::gradients(graph, g_loss, &g_vars, "g_gradients")?;
        let d_op = Optimizer::sgd(0.05).apply_gradients(graph, &d_grads.grads, "d_min")?;
        let g_op =
            Optimizer::momentum(0.05, 0.5).apply_gradients(graph, &g_grads.grads, "g_min")?;
        self.ops = Some((d_op.train_op, g_op.train_op));
        Ok(BuiltGraph {
            losses: vec![("d_loss".into(), d_loss), ("g_loss".into(), g_loss)],
            towers: vec![tower],
            ..BuiltGraph::default()
        })
    }

    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        let (d_op, g_op) = self.ops.expect("built");
        if runner.global_step().is_multiple_of(self.d_period) {
            runner.hooked_run(&[], &[d_op])?;
            self.runs.push("d");
        }
        if runner.global_step().is_multiple_of(self.g_period) {
            runner.hooked_run(&[], &[g_op])?;
            self.runs.push("g");
        }
        Ok(())
    }
}

/// Records which variables each hooked run changed.
struct ChangedVariables {
    changes: Arc<std::sync::Mutex<Vec<(bool, bool)>>>,
    before: Vec<(String, HostTensor)>,
}

impl ChangedVariables {
    fn snapshot(ctx: &mut TrainContext) -> Vec<(String, HostTensor)> {
        ["discrim/fc/W", "gen/fc/W"]
            .iter()
            .map(|n| (n.to_string(), ctx.read_variable(n).expect("read")))
            .collect()
    }
}

impl Callback for ChangedVariables {
    fn chief_only(&self) -> bool {
        false
    }
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.before = ChangedVariables::snapshot(ctx);
        Ok(())
    }
    fn after_run(&mut self, ctx: &mut TrainContext, _: &[HostTensor]) -> Result<(), TrainError> {
        let now = ChangedVariables::snapshot(ctx);
        let changed = |i: usize| now[i].1 != self.before[i].1;
        self.changes
            .lock()
            .expect("changes")
            .push((changed(0), changed(1)));
        self.before = now;
        Ok(())
    }
}

/// Real points near (1, 1, 1, 1) and noise, as a data flow.
fn gan_flow(n: usize) -> impl DataFlow {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let items = (0..n)
        .map(|_| {
            let real: Vec<f32> = (0..4).map(|_| 1.0 + rng.random_range(-0.1..0.1)).collect();
            let z: Vec<f32> = (0..2).map(|_| rng.random_range(-1.0..1.0)).collect();
            vec![
                HostTensor::from_f32(&[4], real).expect("real"),
                HostTensor::from_f32(&[2], z).expect("z"),
            ]
        })
        .collect();
    towerpack::data::BatchData::new(towerpack::data::DataFromList::shuffled(items, 3), 8, false)
        .expect("batch")
}

#[test]
fn a_custom_trainer_alternates_two_optimizers() {
    let changes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let c = TrainConfig::default()
        .dataflow(gan_flow(64))
        .backend(cpu())
        .seed(3)
        .extra_callbacks(Vec::new())
        .monitors(Vec::new())
        .callback(ChangedVariables {
            changes: Arc::clone(&changes),
            before: Vec::new(),
        })
        .max_epoch(2);
    let mut trainer = SeparateGanTrainer {
        d_period: 1,
        g_period: 2,
        ops: None,
        runs: Vec::new(),
    };
    let report = launch_train_with_config(c, &mut trainer).expect("train");
    // global_step counts hooked runs: d at every step, g when the step after d is even.
    let spe = 8;
    assert_eq!(report.counters.steps_per_epoch, spe);
    let mut want = Vec::new();
    let mut gs = 0u64;
    for _ in 0..2 * spe {
        want.extend(["d"]);
        gs += 1;
        if gs.is_multiple_of(2) {
            want.push("g");
            gs += 1;
        }
    }
    assert_eq!(trainer.runs, want);
    assert_eq!(report.counters.global_step, gs);
    // Each hooked run changed exactly the variables of its own optimizer.
    let changes = changes.lock().expect("changes").clone();
    assert_eq!(changes.len(), want.len());
    for (run, (d_changed, g_changed)) in want.iter().zip(changes) {
        match *run {
            "d" => assert!(d_changed && !g_changed),
            _ => assert!(g_changed && !d_changed),
        }
    }
}
