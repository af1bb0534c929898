//! An optimizer defined outside the crate: AdamW (decoupled weight decay, PyTorch's `AdamW`)
//! written against `optim::UpdateRule` with the public graph API. Its first steps match the
//! formula evaluated in f64; it trains the MNIST MLP with its slots in the checkpoints; a run
//! that crashes and resumes from its latest checkpoint ends bit-identical to one that did not;
//! and it composes with gradient accumulation like a built-in.

use crate::train_common;

use std::path::Path;

use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::{Session, Step};
use towerpack::ir::{
    BinaryOp, Graph, Initializer, Op, Shape, TensorType, UnaryOp, Value, VarFlags, VarId,
    VariableDef,
};
use towerpack::models::Mlp;
use towerpack::optim::{
    OptimError, Optimizer, UpdateRule, VariableUpdate, create_slot, get_or_create, read_variable,
};
use towerpack::tensor::{DType, HostTensor};
use towerpack::train::callbacks::{
    ClassificationError, InferenceRunner, Inferencer, ModelSaver, PeriodicTrigger,
};
use towerpack::train::checkpoint::load_checkpoint;
use towerpack::train::*;
use train_common::*;

/// PyTorch's AdamW: `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`, `t = t + 1`,
/// `var = var·(1 - lr·λ) - lr·(m/(1-β1ᵗ)) / (sqrt(v/(1-β2ᵗ)) + ε)`.
/// Slots `{var}/AdamW_m`, `{var}/AdamW_v`; the step count `AdamW/t` is shared.
#[derive(Debug)]
struct AdamW {
    learning_rate: f64,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    weight_decay: f64,
}

impl AdamW {
    fn new(learning_rate: f64, weight_decay: f64) -> AdamW {
        AdamW {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            weight_decay,
        }
    }
}

/// Adds nodes under `scope` on one device.
struct Nodes<'g> {
    graph: &'g mut Graph,
    scope: String,
    device: Option<u16>,
}

impl Nodes<'_> {
    fn add(&mut self, name: &str, op: Op, inputs: &[Value]) -> Result<Value, OptimError> {
        let name = self.graph.unique_name(&format!("{}/{name}", self.scope));
        Ok(Value::first(self.graph.add_node_on(
            &name,
            op,
            inputs,
            self.device,
        )?))
    }
    fn constant(&mut self, name: &str, x: f64) -> Result<Value, OptimError> {
        let value = HostTensor::scalar(DType::F32, x);
        self.add(name, Op::Constant { value }, &[])
    }
    fn bin(&mut self, name: &str, op: BinaryOp, a: Value, b: Value) -> Result<Value, OptimError> {
        self.add(name, Op::Binary(op), &[a, b])
    }
}

impl UpdateRule for AdamW {
    fn name(&self) -> &str {
        "AdamW"
    }

    fn initial_learning_rate(&self) -> f64 {
        self.learning_rate
    }

    fn slot_suffixes(&self) -> Vec<String> {
        vec!["AdamW_m".into(), "AdamW_v".into()]
    }

    fn check_settings(&self) -> Result<(), OptimError> {
        if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) {
            return Err(OptimError::InvalidSetting {
                optimizer: "AdamW".into(),
                what: "beta".into(),
                value: format!("{} / {}", self.beta1, self.beta2),
            });
        }
        Ok(())
    }

    fn updates(
        &self,
        graph: &mut Graph,
        grads: &[(VarId, Value)],
        lr: Value,
    ) -> Result<Vec<VariableUpdate>, OptimError> {
        let scalar = TensorType::scalar(DType::F32);
        let t_var = get_or_create(
            graph,
            "AdamW/t",
            scalar,
            Initializer::Zeros,
            VarFlags::default(),
        )?;
        let t = read_variable(graph, t_var, "AdamW/t/read", None)?;
        // Step-wide scalars: t+1, the bias corrections, lr·λ.
        let mut s = Nodes {
            graph: &mut *graph,
            scope: "AdamW/step".into(),
            device: None,
        };
        let one = s.constant("one", 1.0)?;
        let t_new = s.bin("t", BinaryOp::Add, t, one)?;
        let (b1, b2) = (
            s.constant("beta1", self.beta1)?,
            s.constant("beta2", self.beta2)?,
        );
        let b1t = s.bin("beta1_t", BinaryOp::Pow, b1, t_new)?;
        let b2t = s.bin("beta2_t", BinaryOp::Pow, b2, t_new)?;
        let c1 = s.bin("correction1", BinaryOp::Sub, one, b1t)?;
        let c2 = s.bin("correction2", BinaryOp::Sub, one, b2t)?;
        let wd = s.constant("weight_decay", self.weight_decay)?;
        let lr_wd = s.bin("lr_wd", BinaryOp::Mul, lr, wd)?;
        let decay = s.bin("decay", BinaryOp::Sub, one, lr_wd)?;
        let mut out = vec![VariableUpdate {
            var: t_var,
            current: t,
            new: t_new,
        }];
        for &(var, g) in grads {
            let (m_slot, v_slot) = (
                create_slot(graph, var, "AdamW_m")?,
                create_slot(graph, var, "AdamW_v")?,
            );
            let var_name = graph.variable(var).name.clone();
            let device = graph.node(g.node).device;
            let cur = read_variable(graph, var, &format!("AdamW/{var_name}/read"), device)?;
            let m = read_variable(graph, m_slot, &format!("AdamW/{var_name}/m"), device)?;
            let v = read_variable(graph, v_slot, &format!("AdamW/{var_name}/v"), device)?;
            let mut n = Nodes {
                graph: &mut *graph,
                scope: format!("AdamW/update/{var_name}"),
                device,
            };
            let (one_b1, one_b2) = (
                n.constant("one_minus_beta1", 1.0 - self.beta1)?,
                n.constant("one_minus_beta2", 1.0 - self.beta2)?,
            );
            let (b1, b2) = (
                n.constant("beta1", self.beta1)?,
                n.constant("beta2", self.beta2)?,
            );
            let m_decayed = n.bin("m_decayed", BinaryOp::Mul, b1, m)?;
            let m_step = n.bin("m_step", BinaryOp::Mul, one_b1, g)?;
            let m_new = n.bin("m", BinaryOp::Add, m_decayed, m_step)?;
            let g2 = n.add("g2", Op::Unary(UnaryOp::Square), &[g])?;
            let v_decayed = n.bin("v_decayed", BinaryOp::Mul, b2, v)?;
            let v_step = n.bin("v_step", BinaryOp::Mul, one_b2, g2)?;
            let v_new = n.bin("v", BinaryOp::Add, v_decayed, v_step)?;
            let m_hat = n.bin("m_hat", BinaryOp::Div, m_new, c1)?;
            let v_hat = n.bin("v_hat", BinaryOp::Div, v_new, c2)?;
            let root = n.add("root", Op::Unary(UnaryOp::Sqrt), &[v_hat])?;
            let eps = n.constant("epsilon", self.epsilon)?;
            let denom = n.bin("denom", BinaryOp::Add, root, eps)?;
            let ratio = n.bin("ratio", BinaryOp::Div, m_hat, denom)?;
            let step = n.bin("step", BinaryOp::Mul, lr, ratio)?;
            let decayed = n.bin("decayed", BinaryOp::Mul, cur, decay)?;
            let new = n.bin("new", BinaryOp::Sub, decayed, step)?;
            out.push(VariableUpdate {
                var,
                current: cur,
                new,
            });
            out.push(VariableUpdate {
                var: m_slot,
                current: m,
                new: m_new,
            });
            out.push(VariableUpdate {
                var: v_slot,
                current: v,
                new: v_new,
            });
        }
        Ok(out)
    }
}

/// `w` of 4 floats with gradient input `g`, updated by `opt`: the graph and its training step.
fn single_variable(opt: &Optimizer) -> (Graph, VarId, towerpack::ir::NodeId, Step) {
    let mut g = Graph::new();
    let ty = TensorType::f32(Shape::fixed(&[4]));
    let flags = VarFlags {
        trainable: true,
        ..VarFlags::default()
    };
    let w = g
        .declare_variable(VariableDef {
            name: "w".into(),
            ty: ty.clone(),
            init: Initializer::Value(
                HostTensor::from_f32(&[4], vec![1.0, -2.0, 0.5, 3.0]).expect("w"),
            ),
            flags,
        })
        .expect("declare");
    let grad = g
        .add_node(
            "grad",
            Op::Input {
                name: "grad".into(),
                ty,
            },
            &[],
        )
        .expect("input");
    let train = opt
        .apply_gradients(&mut g, &[(w, Value::first(grad))], "train_op")
        .expect("apply");
    let step = Step::new(Vec::new(), vec![train.train_op]);
    (g, w, grad, step)
}

#[test]
fn adamw_steps_match_the_formula_in_f64() {
    let (lr, wd) = (0.01, 0.1);
    let (graph, w, grad, step) = single_variable(&Optimizer::custom(AdamW::new(lr, wd)));
    let mut session = CpuSession::new(graph, CpuOptions::default()).expect("session");
    session.initialize_variables(1).expect("init");
    let grads = [[0.5f32, -1.0, 2.0, 0.0], [0.25, 1.5, -2.0, 1e-3]];
    let (mut want, mut m, mut v) = (vec![1.0f64, -2.0, 0.5, 3.0], [0.0f64; 4], [0.0f64; 4]);
    for (t, gs) in grads.iter().enumerate() {
        let feed = HostTensor::from_f32(&[4], gs.to_vec()).expect("grad");
        session.run(&step, &[(grad, feed)]).expect("step");
        let t = (t + 1) as i32;
        for i in 0..4 {
            let g = f64::from(gs[i]);
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            let m_hat = m[i] / (1.0 - 0.9f64.powi(t));
            let v_hat = v[i] / (1.0 - 0.999f64.powi(t));
            want[i] = want[i] * (1.0 - lr * wd) - lr * m_hat / (v_hat.sqrt() + 1e-8);
        }
        let got = session.read_variable(w).expect("read").to_f64_vec();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "step {t}, w[{i}] = {a}, formula {b}"
            );
        }
    }
    // The decay alone moved the variable with a zero gradient (w[3] at step 1).
    assert!(want[3] < 3.0);
}

/// The MNIST MLP (784-32-10) with AdamW, held-out error per epoch, a checkpoint every 8 steps.
fn mlp_config(dir: &Path) -> TrainConfig {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![32],
        classes: 10,
        ..Mlp::default()
    };
    let inputs = mlp.inputs();
    let model = ModelFn::new(
        inputs,
        move |x| mlp.build(x),
        Optimizer::custom(AdamW::new(3e-3, 1e-2)),
    );
    let infs: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::default())];
    bare(config(model, train_flow(512, 32, 3), Some(dir)))
        .callback(PeriodicTrigger::new(ModelSaver::new()).every_k_steps(8))
        .callback(InferenceRunner::new(val_flow(256, 64), infs))
        .max_epoch(3)
}

#[test]
fn adamw_trains_the_mlp_checkpoints_its_slots_and_resumes_bitwise() {
    let straight = tempfile::tempdir().expect("tempdir");
    let report = launch_train_with_config(mlp_config(straight.path()), &mut SimpleTrainer::new())
        .expect("train");
    assert_eq!(report.counters.global_step, 48);
    let errors = report.history("validation_error");
    let last = errors.last().expect("an epoch").1;
    // 512 training digits, 3 epochs, 256 held-out digits (never trained on): measured 0.336,
    // 0.223, 0.184 after epochs 1-3 (chance is 0.9).
    assert!(
        last < 0.25 && last < errors[0].1,
        "held-out error per epoch: {errors:?}"
    );
    let reference = variable_bytes(report.session.as_ref());
    let ckpt = load_checkpoint(straight.path()).expect("checkpoint");
    for name in ["fc0/W/AdamW_m", "fc0/W/AdamW_v", "AdamW/t"] {
        assert!(ckpt.tensors.contains_key(name), "{name} is checkpointed");
    }
    assert_eq!(ckpt.tensors["AdamW/t"].scalar_value().expect("t"), 48.0);

    // Crash at step 21 (latest checkpoint: step 16, mid-epoch 2), resume to the end.
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = launch_train_with_config(
        mlp_config(dir.path()).callback(Abort { at: 21 }),
        &mut SimpleTrainer::new(),
    );
    assert!(crashed.is_err(), "the run crashes at step 21");
    let resumed = launch_train_with_config(
        mlp_config(dir.path()).auto_resume(true),
        &mut SimpleTrainer::new(),
    )
    .expect("resume");
    assert_eq!(resumed.resumed.as_ref().expect("resumed").global_step, 16);
    let after = variable_bytes(resumed.session.as_ref());
    assert_eq!(reference.len(), after.len());
    for ((na, va), (nb, vb)) in reference.iter().zip(&after) {
        assert_eq!(na, nb);
        assert!(va == vb, "`{na}` differs after resuming");
    }
}

#[test]
fn adamw_composes_with_gradient_accumulation() {
    // Two micro-steps with gradients a and b under accumulate(2) equal one AdamW step on a+b.
    let (lr, wd) = (0.01, 0.1);
    let (graph, w, grad, step) =
        single_variable(&Optimizer::custom(AdamW::new(lr, wd)).accumulate(2));
    let mut acc = CpuSession::new(graph, CpuOptions::default()).expect("session");
    acc.initialize_variables(1).expect("init");
    let (a, b) = ([0.5f32, -1.0, 2.0, 0.0], [0.25f32, 1.5, -2.0, 1e-3]);
    for gs in [a, b] {
        let feed = HostTensor::from_f32(&[4], gs.to_vec()).expect("grad");
        acc.run(&step, &[(grad, feed)]).expect("micro-step");
    }
    let (graph, w1, grad1, step1) = single_variable(&Optimizer::custom(AdamW::new(lr, wd)));
    let mut one = CpuSession::new(graph, CpuOptions::default()).expect("session");
    one.initialize_variables(1).expect("init");
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let feed = HostTensor::from_f32(&[4], sum).expect("grad");
    one.run(&step1, &[(grad1, feed)]).expect("step");
    let (x, y) = (
        acc.read_variable(w).expect("read").to_f64_vec(),
        one.read_variable(w1).expect("read").to_f64_vec(),
    );
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(
            (p - q).abs() <= 1e-6,
            "w[{i}]: accumulated {p}, one step {q}"
        );
    }
    assert!(x != [1.0, -2.0, 0.5, 3.0], "the variable moved");
}
