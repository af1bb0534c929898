//! A DCGAN on the embedded MNIST digits, trained by a custom trainer that overrides `run_step` to
//! alternate two optimizers (tensorpack's `GANTrainer` pattern): each step minimizes the
//! discriminator's loss, then the generator's, in two hooked runs. Samples of the generator go to
//! TensorBoard as images at the end of every epoch (`tensorboard --logdir train_log/gan`).
//!
//! ```text
//! cargo run --release --example gan      # 20 epochs, about 2.5 minutes on 2 cores
//! cargo run --release --example gan -- --export generator.onnx --load train_log/gan
//! ```
//!
//! Digit-like strokes appear after about 10 epochs (1,250 steps of batch 64). The model is the
//! library's [`towerpack::models::Dcgan`]; this file is the trainer and the data.

use std::error::Error;
use std::path::PathBuf;

use clap::Parser;

#[path = "common/cli.rs"]
mod cli;
use towerpack::data::{BatchData, DataError, MapData, mnist10k_split};
use towerpack::ir::{NodeId, Value};
use towerpack::models::Dcgan;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::tower::TowerContext;
use towerpack::train::callbacks::{ModelSaver, NonFiniteGuard};
use towerpack::train::{
    BuiltGraph, Callback, GraphSetup, RunArgs, SetupError, StepRunner, TrainConfig, TrainContext,
    TrainError, Trainer, launch_train_with_config,
};

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Train a DCGAN on the embedded MNIST digits")]
struct Args {
    #[command(flatten)]
    common: cli::CommonArgs,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Write the generator (input `z` [N, 64], output `gen/deconv1/output` [N, 28, 28, 1] in
    /// [-1, 1]) with the checkpoint `--load` (default: the latest in the logdir) to this ONNX
    /// file (opset 17) instead of training.
    #[arg(long)]
    export: Option<PathBuf>,
}

/// The defaults of the shared flags.
const DEFAULTS: cli::Defaults = cli::Defaults {
    logdir: "train_log/gan",
    max_epoch: "20",
};

/// A trainer with two optimizers: every step runs the discriminator's update, then the
/// generator's, each as its own hooked run (so the global step advances by two per step, as
/// tensorpack counts hooked runs).
#[derive(Default)]
struct GanTrainer {
    /// `(d_min, g_min)` once the graph is built.
    ops: Option<(NodeId, NodeId)>,
}

impl Trainer for GanTrainer {
    fn name(&self) -> String {
        "GanTrainer".into()
    }

    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        let model = Dcgan::default();
        let signature = model.inputs();
        setup.input.setup(&signature)?;
        let tower = setup.with_builder(|b| {
            b.build_tower(TowerContext::training("", "", 0, 1), &signature, |x| {
                model.build(x)
            })
        })??;
        setup.register_tower(&tower)?;
        let graph = &mut *setup.graph;
        let missing = |what: &str| TrainError::TensorNotFound {
            name: what.to_string(),
            hint: " (the GAN tower defines it)".to_string(),
        };
        let d_loss = graph
            .find_value("d_loss")
            .ok_or_else(|| missing("d_loss"))?;
        let g_loss = tower.cost.ok_or_else(|| missing("g_loss"))?;
        let variables_under = |graph: &towerpack::ir::Graph, scope: &str| {
            tower
                .gradient_variables(graph)
                .into_iter()
                .filter(|&v| graph.variable(v).name.starts_with(scope))
                .collect::<Vec<_>>()
        };
        let d_vars = variables_under(graph, "discrim/");
        let g_vars = variables_under(graph, "gen/");
        let d_grads = towerpack::autodiff::gradients(graph, d_loss, &d_vars, "d_gradients")?;
        let g_grads = towerpack::autodiff::gradients(graph, g_loss, &g_vars, "g_gradients")?;
        // DCGAN's Adam: learning rate 2e-4, beta1 0.5. Each optimizer keeps its own beta powers.
        let adam = Optimizer::Adam {
            learning_rate: 2e-4,
            beta1: 0.5,
            beta2: 0.999,
            epsilon: 1e-8,
        };
        let d_min = adam.apply_gradients(graph, &d_grads.grads, "d_min")?;
        let g_min = adam.apply_gradients(graph, &g_grads.grads, "g_min")?;
        self.ops = Some((d_min.train_op, g_min.train_op));
        Ok(BuiltGraph {
            losses: vec![("d_loss".into(), d_loss), ("g_loss".into(), g_loss)],
            towers: vec![tower],
            ..BuiltGraph::default()
        })
    }

    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        let (d_min, g_min) = self.ops.ok_or_else(|| SetupError::NotBuilt {
            trainer: "GanTrainer".into(),
        })?;
        runner.hooked_run(&[], &[d_min])?;
        runner.hooked_run(&[], &[g_min])?;
        Ok(())
    }
}

/// Puts 16 generated digits into the monitors (TensorBoard images) at the last hooked run of
/// every epoch, and the two losses as scalars.
#[derive(Default)]
struct GanSamples {
    fetches: Option<[Value; 3]>,
    fetching: bool,
}

impl Callback for GanSamples {
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.fetches = Some([
            ctx.get_tensor("gen/samples")?,
            ctx.get_tensor("d_loss")?,
            ctx.get_tensor("g_loss")?,
        ]);
        Ok(())
    }

    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        // The generator's run is the second of the epoch's last step.
        let last_step = ctx.local_step() + 1 == ctx.steps_per_epoch() as i64;
        self.fetching = last_step && ctx.global_step() % 2 == 1;
        match (&self.fetches, self.fetching) {
            (Some(f), true) => Ok(RunArgs::fetch(f.to_vec())),
            _ => Ok(RunArgs::none()),
        }
    }

    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        values: &[HostTensor],
    ) -> Result<(), TrainError> {
        if !self.fetching {
            return Ok(());
        }
        let [samples, d_loss, g_loss] = values else {
            return Err(TrainError::callback(
                "GanSamples",
                format!("expected three fetched values, got {}", values.len()),
            ));
        };
        let bad =
            |e: towerpack::tensor::TensorError| TrainError::callback("GanSamples", e.to_string());
        let shown = samples.shape()[0].min(16);
        let pixels = samples.as_f32().map_err(bad)?;
        let first = HostTensor::from_f32(&[shown, 28, 28, 1], pixels[..shown * 28 * 28].to_vec())
            .map_err(bad)?;
        ctx.put_image("gen/samples", &first)?;
        ctx.put_scalar("d_loss", d_loss.scalar_value().map_err(bad)?)?;
        ctx.put_scalar("g_loss", g_loss.scalar_value().map_err(bad)?)?;
        Ok(())
    }
}

fn main() {
    let args: Args = cli::parse(&DEFAULTS);
    if let Err(e) = run(&args) {
        // Ctrl-C or SIGTERM: the run saved a checkpoint and its log line said where (no second
        // line here); exit as a shell reports a death by that signal (130 for SIGINT).
        if let Some(code) = e
            .downcast_ref::<TrainError>()
            .and_then(TrainError::interrupted_exit_code)
        {
            std::process::exit(code);
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    if let Some(file) = &args.export {
        let load = args
            .common
            .load
            .clone()
            .unwrap_or_else(|| args.common.logdir(&DEFAULTS));
        let z: Vec<_> = Dcgan::default()
            .inputs()
            .into_iter()
            .filter(|s| s.name == "z")
            .collect();
        let generator = |x: &[towerpack::dsl::Tensor]| towerpack::models::generator(&x[0]);
        let report = towerpack::export::onnx::OnnxExport::from_tower(z, generator, &[])
            .write(&load, file)?;
        println!("{report}");
        return Ok(());
    }
    // Real digits scaled to [-1, 1] (the generator's tanh range), each with its own noise vector
    // drawn from the datapoint's counter-based key (so a resumed run draws the same noise).
    let digits = mnist10k_split()?.train.to_f32(2.0 / 255.0);
    let z_dim = Dcgan::default().z_dim;
    let with_noise = MapData::new(digits.to_flow(Some(args.common.seed))?, move |dp, ctx| {
        let key = ctx.key(17);
        let z: Vec<f32> = (0..z_dim as u64)
            .map(|i| (key.uniform(i) * 2.0 - 1.0) as f32)
            .collect();
        let image = dp.into_iter().next().ok_or_else(|| DataError::Config {
            flow: "gan",
            what: "empty datapoint".into(),
        })?;
        let image = image.as_f32()?.iter().map(|x| x - 1.0).collect();
        Ok(vec![
            HostTensor::from_f32(&[28, 28, 1], image)?,
            HostTensor::from_f32(&[z_dim], z)?,
        ])
    });
    let flow = BatchData::new(with_noise, args.batch, false)?;
    let config = TrainConfig::default()
        .dataflow(flow)
        .callback(GanSamples::default())
        .callback(ModelSaver::new())
        // A non-finite loss or gradient stops the run naming it and its step, before the epoch is saved.
        .callback(NonFiniteGuard::new())
        .max_epoch(args.common.max_epoch.unwrap_or(20));
    let config = args.common.apply(config, &DEFAULTS);
    let report = launch_train_with_config(config, &mut GanTrainer::default())?;
    println!(
        "trained {} epochs ({} hooked runs); samples are in {}'s TensorBoard events",
        report.counters.epoch_num,
        report.counters.global_step,
        report.logdir.unwrap_or_default().display()
    );
    Ok(())
}
