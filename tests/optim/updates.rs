//! Optimizer updates run through the reference executor equal hand-computed updates over three
//! steps (SGD, Momentum, Nesterov, Adam), with the learning rate changed between steps through
//! the `learning_rate` variable as a callback would.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::Session;
use towerpack::backend::reference::ReferenceSession;
use towerpack::ir::{
    Graph, Initializer, NodeId, Op, Shape, Step, TensorType, Value, VarFlags, VariableDef,
};
use towerpack::optim::{Optimizer, TrainOp, global_step, increment_global_step};
use towerpack::tensor::{DType, HostTensor};

const SHAPE: [usize; 2] = [2, 3];
/// f32 arithmetic against an f64 hand computation.
const TOLERANCE: f64 = 2e-6;

struct Setup {
    session: ReferenceSession,
    grad_input: NodeId,
    train: TrainOp,
    rng: ChaCha8Rng,
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn f32s(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x as f32)).collect()
}

fn setup(opt: &Optimizer, seed: u64) -> (Setup, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = SHAPE.iter().product();
    let w0 = f32s(&random(&mut rng, n));
    let mut g = Graph::new();
    let w = g
        .declare_variable(VariableDef {
            name: "fc/W".into(),
            ty: TensorType::f32(Shape::fixed(&SHAPE)),
            init: Initializer::Value(
                HostTensor::from_f64_values(DType::F32, &SHAPE, w0.clone()).expect("init"),
            ),
            flags: VarFlags {
                trainable: true,
                ..VarFlags::default()
            },
        })
        .expect("declare");
    let ty = TensorType::f32(Shape::fixed(&SHAPE));
    let grad_input = g
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
        .apply_gradients(&mut g, &[(w, Value::first(grad_input))], "train_op")
        .expect("apply");
    let mut session = ReferenceSession::new(g).expect("session");
    session.initialize_variables(seed).expect("init");
    (
        Setup {
            session,
            grad_input,
            train,
            rng,
        },
        w0,
    )
}

impl Setup {
    /// Runs one step with a fresh random gradient (rounded to f32) and returns it.
    fn step(&mut self) -> Vec<f64> {
        let n = SHAPE.iter().product();
        let grad = f32s(&random(&mut self.rng, n));
        let feed = HostTensor::from_f64_values(DType::F32, &SHAPE, grad.clone()).expect("grad");
        self.session
            .run(
                &Step::new(vec![], vec![self.train.train_op]),
                &[(self.grad_input, feed)],
            )
            .expect("step");
        grad
    }

    fn read(&self, name: &str) -> Vec<f64> {
        let var = self.session.graph().find_variable(name).expect(name);
        self.session.read_variable(var).expect("read").to_f64_vec()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        let var = self
            .session
            .graph()
            .find_variable("learning_rate")
            .expect("lr");
        self.session
            .write_variable(var, &HostTensor::scalar_f32(lr as f32))
            .expect("write lr");
    }
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= TOLERANCE * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// The learning rates of the three steps: the optimizer's, then two set by "callbacks".
const RATES: [f64; 3] = [0.1, 0.05, 0.2];

#[test]
fn sgd_matches_a_hand_computed_update() {
    let (mut s, mut w) = setup(&Optimizer::sgd(RATES[0]), 1);
    for (k, &lr) in RATES.iter().enumerate() {
        s.set_learning_rate(lr);
        let g = s.step();
        for (wi, gi) in w.iter_mut().zip(&g) {
            *wi -= lr * gi;
        }
        assert_close(&s.read("fc/W"), &w, &format!("step {k} W"));
    }
}

fn momentum_case(nesterov: bool, seed: u64) {
    let mu = 0.9;
    let opt = if nesterov {
        Optimizer::nesterov(RATES[0], mu)
    } else {
        Optimizer::momentum(RATES[0], mu)
    };
    let (mut s, mut w) = setup(&opt, seed);
    let mut acc = vec![0.0; w.len()];
    for (k, &lr) in RATES.iter().enumerate() {
        s.set_learning_rate(lr);
        let g = s.step();
        for i in 0..w.len() {
            acc[i] = mu * acc[i] + g[i];
            w[i] -= if nesterov {
                lr * g[i] + lr * mu * acc[i]
            } else {
                lr * acc[i]
            };
        }
        assert_close(&s.read("fc/W"), &w, &format!("step {k} W"));
        assert_close(&s.read("fc/W/Momentum"), &acc, &format!("step {k} accum"));
    }
}

#[test]
fn momentum_matches_a_hand_computed_update() {
    momentum_case(false, 2);
}

#[test]
fn nesterov_matches_a_hand_computed_update() {
    momentum_case(true, 3);
}

/// A large epsilon pins its placement: TF adds it to `sqrt(v)`, not to `sqrt(v_hat)` (the two
/// differ by a factor `sqrt(1 - beta2^t)` on epsilon, about 0.03 at the first step).
#[test]
fn adam_matches_tensorflows_update_including_the_epsilon_placement() {
    adam_case(1e-8, 4);
    adam_case(1e-2, 5);
}

fn adam_case(eps: f64, seed: u64) {
    let (b1, b2) = (0.9, 0.999);
    let opt = Optimizer::Adam {
        learning_rate: RATES[0],
        beta1: b1,
        beta2: b2,
        epsilon: eps,
    };
    let (mut s, mut w) = setup(&opt, seed);
    let (mut m, mut v) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    let (mut b1p, mut b2p) = (b1, b2);
    for (k, &lr) in RATES.iter().enumerate() {
        s.set_learning_rate(lr);
        let g = s.step();
        let lr_t = lr * (1.0 - b2p).sqrt() / (1.0 - b1p);
        for i in 0..w.len() {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            w[i] -= lr_t * m[i] / (v[i].sqrt() + eps);
        }
        b1p *= b1;
        b2p *= b2;
        assert_close(&s.read("fc/W"), &w, &format!("step {k} W"));
        assert_close(&s.read("fc/W/Adam"), &m, &format!("step {k} m"));
        assert_close(&s.read("fc/W/Adam_1"), &v, &format!("step {k} v"));
        assert_close(&s.read("beta1_power"), &[b1p], "beta1_power");
        assert_close(&s.read("beta2_power"), &[b2p], "beta2_power");
    }
}

#[test]
fn global_step_is_incremented_by_its_own_assign() {
    let mut g = Graph::new();
    let step = global_step(&mut g).expect("global_step");
    assert_eq!(global_step(&mut g).expect("again"), step, "get-or-create");
    let inc = increment_global_step(&mut g, "global_step_increment").expect("increment");
    let mut s = ReferenceSession::new(g).expect("session");
    s.initialize_variables(0).expect("init");
    for k in 1..=3 {
        s.run(&Step::new(vec![], vec![inc]), &[]).expect("run");
        let v = s.read_variable(step).expect("read");
        assert_eq!(v.dtype(), DType::I64);
        assert_eq!(v.to_f64_vec(), vec![f64::from(k)]);
    }
}
