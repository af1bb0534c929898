//! Get-variable semantics of the `VariableStore` (exists, missing, mismatched reuse, inherited
//! reuse) and the properties of `TowerContext`, exercised directly on a graph.

use towerpack::ir::{Graph, Shape, TensorType};
use towerpack::tensor::DType;
use towerpack::tower::{
    MOVING_SUMMARY, SUMMARIES, TowerContext, TowerError, UPDATE_OPS, VarSpec, VariableStore,
};

#[test]
fn get_variable_without_reuse_refuses_an_existing_variable() {
    let mut g = Graph::new();
    let mut s = VariableStore::new();
    s.push_variable_scope("conv0", None).expect("scope");
    let w = s
        .get_variable(&mut g, "W", &VarSpec::new(&[3, 3]))
        .expect("create");
    assert_eq!(g.variable(w).name, "conv0/W");
    assert_eq!(
        s.get_variable(&mut g, "W", &VarSpec::new(&[3, 3])),
        Err(TowerError::VariableExists {
            name: "conv0/W".into()
        })
    );
}

#[test]
fn get_variable_under_reuse_shares_or_refuses() {
    let mut g = Graph::new();
    let mut s = VariableStore::new();
    let depth = s.push_variable_scope("fc", None).expect("scope");
    let w = s
        .get_variable(&mut g, "W", &VarSpec::new(&[4, 2]))
        .expect("create");
    s.restore(depth);

    s.push_variable_scope("fc", Some(true))
        .expect("reuse scope");
    assert_eq!(s.get_variable(&mut g, "W", &VarSpec::new(&[4, 2])), Ok(w));
    assert_eq!(
        s.get_variable(&mut g, "b", &VarSpec::new(&[2])),
        Err(TowerError::VariableMissing {
            name: "fc/b".into()
        })
    );
    let err = s
        .get_variable(&mut g, "W", &VarSpec::new(&[4, 3]))
        .expect_err("shape mismatch");
    assert_eq!(
        err,
        TowerError::ReuseMismatch {
            name: "fc/W".into(),
            existing: Box::new(TensorType::f32(Shape::fixed(&[4, 2]))),
            requested: Box::new(TensorType::f32(Shape::fixed(&[4, 3]))),
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("f32[4,2]") && msg.contains("f32[4,3]"),
        "{msg}"
    );
    let err = s
        .get_variable(&mut g, "W", &VarSpec::new(&[4, 2]).dtype(DType::F64))
        .expect_err("dtype mismatch");
    assert!(err.to_string().contains("f64[4,2]"), "{err}");
}

#[test]
fn reuse_is_inherited_and_cannot_be_turned_off_inside() {
    let mut s = VariableStore::new();
    assert!(!s.reuse());
    s.push_variable_scope("a", Some(true)).expect("a");
    s.push_variable_scope("b", None).expect("b");
    assert!(s.reuse());
    s.push_variable_scope("c", Some(false)).expect("c");
    assert!(
        s.reuse(),
        "TF1: reuse=False inside a reusing scope inherits"
    );
    assert_eq!(s.variable_scope(), "a/b/c");
    assert_eq!(s.name_scope(), "a/b/c");
}

#[test]
fn new_variable_is_uniquified_and_ignores_reuse() {
    let mut g = Graph::new();
    let mut s = VariableStore::new();
    s.push_variable_scope("x", Some(true)).expect("scope");
    let spec = VarSpec::new(&[]).trainable(false);
    let a = s.new_variable(&mut g, "v", &spec).expect("first");
    let b = s.new_variable(&mut g, "v", &spec).expect("second");
    assert_eq!(g.variable(a).name, "x/v");
    assert_eq!(g.variable(b).name, "x/v_1");
}

#[test]
fn towers_record_what_they_create_and_flag_replica_variables_local() {
    let mut g = Graph::new();
    let mut s = VariableStore::new();
    s.enter_tower(TowerContext::training("tower1", "tower1", 1, 2))
        .expect("enter");
    assert_eq!(s.variable_scope(), "tower1");
    let spec = VarSpec::new(&[2]).trainable(false).model(true);
    let ema = s.get_variable(&mut g, "mean/EMA", &spec).expect("ema");
    let w = s.get_variable(&mut g, "W", &VarSpec::new(&[2])).expect("w");
    let (ctx, created) = s.exit_tower().expect("active");
    assert_eq!(ctx.ns_name(), "tower1");
    assert_eq!(created, [ema, w]);
    assert_eq!(s.variable_scope(), "");
    for id in [ema, w] {
        let flags = g.variable(id).flags;
        assert!(flags.local && !flags.model, "{:?}", g.variable(id));
    }
    assert!(g.variable(w).flags.trainable);
}

#[test]
fn tower_context_properties_follow_tensorpack() {
    // (context, has_own_variables, is_main_training_tower, creates_local_variables)
    let cases = [
        (TowerContext::training("", "", 0, 1), true, true, false),
        (
            TowerContext::training("tower0", "", 0, 2),
            true,
            true,
            false,
        ),
        (
            TowerContext::training("tower1", "", 1, 2).with_reuse(true),
            false,
            false,
            false,
        ),
        (
            TowerContext::training("tower1", "tower1", 1, 2),
            true,
            false,
            true,
        ),
        (
            TowerContext::inference("InferenceTower", "").with_reuse(true),
            false,
            false,
            false,
        ),
        (TowerContext::inference("", ""), true, false, false),
    ];
    for (ctx, own, main, local) in cases {
        assert_eq!(ctx.has_own_variables(), own, "{ctx:?}");
        assert_eq!(ctx.is_main_training_tower(), main, "{ctx:?}");
        assert_eq!(ctx.creates_local_variables(), local, "{ctx:?}");
    }
}

#[test]
fn collections_freeze_outside_the_main_training_tower() {
    let main = TowerContext::training("tower0", "", 0, 2);
    let other = TowerContext::training("tower1", "", 1, 2).with_reuse(true);
    let infer = TowerContext::inference("InferenceTower", "").with_reuse(true);
    for key in [SUMMARIES, MOVING_SUMMARY, UPDATE_OPS] {
        assert!(!main.discards(key), "{key}");
        assert_eq!(other.discards(key), key != UPDATE_OPS, "{key}");
        assert!(infer.discards(key), "{key}");
    }
    assert_eq!(main.device(), Some(0));
    assert_eq!(other.device(), Some(1));
    assert_eq!(infer.device(), None);
}
