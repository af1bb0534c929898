//! Slot variables, `learning_rate` and `train_op` structure, and the typed errors of applying
//! gradients.

use towerpack::ir::{
    Graph, Initializer, Op, Shape, TensorType, Value, VarFlags, VarId, VariableDef, verify,
};
use towerpack::optim::{LEARNING_RATE, OptimError, Optimizer, learning_rate};
use towerpack::tensor::DType;

fn var(g: &mut Graph, name: &str, local: bool) -> VarId {
    g.declare_variable(VariableDef {
        name: name.into(),
        ty: TensorType::f32(Shape::fixed(&[3, 3, 2, 4])),
        init: Initializer::Zeros,
        flags: VarFlags {
            trainable: !local,
            model: false,
            local,
        },
    })
    .expect("declare")
}

fn grad_for(g: &mut Graph, v: VarId) -> Value {
    let name = format!("{}/grad", g.variable(v).name);
    let ty = g.variable(v).ty.clone();
    Value::first(
        g.add_node(
            &name,
            Op::Input {
                name: name.clone(),
                ty,
            },
            &[],
        )
        .expect("grad"),
    )
}

fn flags_of(g: &Graph, name: &str) -> VarFlags {
    let id = g
        .find_variable(name)
        .unwrap_or_else(|| panic!("no variable {name}"));
    g.variable(id).flags
}

#[test]
fn slots_are_named_after_their_variable_and_follow_its_locality() {
    for (opt, suffixes) in [
        (Optimizer::momentum(0.1, 0.9), vec!["Momentum"]),
        (Optimizer::adam(1e-3), vec!["Adam", "Adam_1"]),
    ] {
        let mut g = Graph::new();
        let w0 = var(&mut g, "conv0/W", false);
        let w1 = var(&mut g, "tower1/conv0/W", true);
        let grads = [(w0, grad_for(&mut g, w0)), (w1, grad_for(&mut g, w1))];
        let train = opt
            .apply_gradients(&mut g, &grads, "train_op")
            .expect("apply");
        verify(&g).expect("valid");
        for s in &suffixes {
            let main = flags_of(&g, &format!("conv0/W/{s}"));
            assert!(!main.trainable && !main.local, "{s}: {main:?}");
            let replica = flags_of(&g, &format!("tower1/conv0/W/{s}"));
            assert!(!replica.trainable && replica.local, "{s}: {replica:?}");
            let slot = g.find_variable(&format!("conv0/W/{s}")).expect("slot");
            assert_eq!(g.variable(slot).ty, g.variable(w0).ty);
            assert_eq!(g.variable(slot).init, Initializer::Zeros);
        }
        // train_op groups one assign per variable, slot and optimizer state variable.
        let group = g.node(train.train_op);
        assert_eq!(group.name, "train_op");
        assert!(matches!(group.op, Op::Group));
        assert_eq!(g.control_inputs(train.train_op).len(), train.assigns.len());
        let per_var = 1 + suffixes.len();
        let state = if suffixes.len() == 2 { 2 } else { 0 }; // Adam's beta powers
        assert_eq!(train.assigns.len(), 2 * per_var + state);
        let lr = flags_of(&g, LEARNING_RATE);
        assert!(!lr.trainable && !lr.local);
    }
}

#[test]
fn learning_rate_is_get_or_create_and_keeps_an_existing_variable() {
    let mut g = Graph::new();
    let first = learning_rate(&mut g, 0.1).expect("create");
    assert_eq!(g.variable(first).init, Initializer::Constant(0.1));
    assert_eq!(g.variable(first).ty, TensorType::scalar(DType::F32));
    let w = var(&mut g, "fc/W", false);
    let grad = grad_for(&mut g, w);
    Optimizer::sgd(0.5)
        .apply_gradients(&mut g, &[(w, grad)], "train_op")
        .expect("apply");
    assert_eq!(g.find_variable(LEARNING_RATE), Some(first));
    assert_eq!(g.variable(first).init, Initializer::Constant(0.1));

    let mut wrong = Graph::new();
    wrong
        .declare_variable(VariableDef {
            name: LEARNING_RATE.into(),
            ty: TensorType::scalar(DType::F64),
            init: Initializer::Zeros,
            flags: VarFlags::default(),
        })
        .expect("declare");
    let err = learning_rate(&mut wrong, 0.1).unwrap_err();
    assert!(matches!(err, OptimError::VariableType { .. }), "{err}");
}

#[test]
fn applying_twice_is_a_typed_error() {
    let mut g = Graph::new();
    let w = var(&mut g, "conv0/W", false);
    let grad = grad_for(&mut g, w);
    let opt = Optimizer::momentum(0.1, 0.9);
    opt.apply_gradients(&mut g, &[(w, grad)], "train_op")
        .expect("first");
    let (nodes, vars) = (g.node_count(), g.variables().len());
    let err = opt
        .apply_gradients(&mut g, &[(w, grad)], "train_op")
        .unwrap_err();
    assert_eq!(
        (g.node_count(), g.variables().len()),
        (nodes, vars),
        "nothing added"
    );
    assert!(
        err.to_string().contains("conv0/W/Momentum"),
        "the error names the slot: {err}"
    );

    // Adam's beta powers are per application, as TF's per optimizer instance: a second Adam
    // (a GAN's other network) gets `beta1_power_1`, so neither advances the other's.
    let mut g = Graph::new();
    let a = var(&mut g, "a/W", false);
    let b = var(&mut g, "b/W", false);
    let (ga, gb) = (grad_for(&mut g, a), grad_for(&mut g, b));
    let adam = Optimizer::adam(1e-3);
    adam.apply_gradients(&mut g, &[(a, ga)], "train_a")
        .expect("first");
    adam.apply_gradients(&mut g, &[(b, gb)], "train_b")
        .expect("second");
    for name in [
        "beta1_power",
        "beta2_power",
        "beta1_power_1",
        "beta2_power_1",
    ] {
        let v = g.find_variable(name).unwrap_or_else(|| panic!("{name}"));
        let assigns = g
            .node_ids()
            .filter(|&id| g.node(id).op == towerpack::ir::Op::Assign { var: v })
            .count();
        assert_eq!(assigns, 1, "{name} is assigned by exactly one train op");
    }
    // Applying it again to the same variable is still an error: its slots exist.
    let nodes = g.node_count();
    let err = adam
        .apply_gradients(&mut g, &[(a, ga)], "train_a_again")
        .unwrap_err();
    assert_eq!(g.node_count(), nodes, "nothing added");
    assert!(matches!(err, OptimError::SlotExists { .. }), "{err:?}");
}

#[test]
fn gradients_of_the_wrong_type_and_duplicates_are_typed_errors() {
    let mut g = Graph::new();
    let w = var(&mut g, "fc/W", false);
    let ty = TensorType::f32(Shape::fixed(&[3]));
    let bad = Value::first(
        g.add_node(
            "bad",
            Op::Input {
                name: "bad".into(),
                ty,
            },
            &[],
        )
        .expect("input"),
    );
    let err = Optimizer::sgd(0.1)
        .apply_gradients(&mut g, &[(w, bad)], "train_op")
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("fc/W") && msg.contains("f32[3]"), "{msg}");

    let grad = grad_for(&mut g, w);
    let err = Optimizer::sgd(0.1)
        .apply_gradients(&mut g, &[(w, grad), (w, grad)], "train_op")
        .unwrap_err();
    assert_eq!(
        err,
        OptimError::DuplicateGradient {
            variable: "fc/W".into()
        }
    );
    let err = Optimizer::sgd(0.1)
        .accumulate(0)
        .apply_gradients(&mut g, &[(w, grad)], "train_op")
        .unwrap_err();
    assert!(matches!(err, OptimError::InvalidSetting { .. }), "{err}");
}
