//! Every rule of a tower function, broken (asserting the exact `TowerError` variant) and
//! followed (asserting the graph that results).

use towerpack::dsl::prelude::*;
use towerpack::ir::Graph;
use towerpack::tower::{NameKind, TowerError};

fn sig() -> Vec<InputSpec> {
    vec![InputSpec::new("x", DType::F32, Shape::batched(&[4]))]
}

fn weight() -> VarSpec {
    VarSpec::new(&[4, 2])
}

/// A well-behaved tower: `sum(x · W)` with `W` from `get_variable`.
fn dense(x: &Tensor) -> Tensor {
    let w = x.builder().get_variable("W", &weight());
    x.matmul(&w).sum()
}

fn rule(result: Result<impl std::fmt::Debug, DslError>) -> TowerError {
    match result {
        Err(e) => e
            .tower_error()
            .cloned()
            .unwrap_or_else(|| panic!("expected a tower rule, got {e}")),
        Ok(v) => panic!("expected a broken rule, got {v:?}"),
    }
}

fn var_names(g: &Graph) -> Vec<String> {
    g.variables().iter().map(|v| v.name.clone()).collect()
}

fn ctx_of(x: &Tensor) -> TowerContext {
    x.builder().tower_context().expect("inside a tower")
}

// ---- rule: no new trainable variable in a tower that does not own variables --------------

#[test]
fn new_trainable_in_inference_tower_is_refused() {
    let b = Builder::new();
    b.build_tower(TowerContext::training("", "", 0, 1), &sig(), |x| {
        dense(&x[0])
    })
    .expect("training tower");
    let err = rule(build_inference_tower(
        &b,
        &sig(),
        "InferenceTower",
        "",
        &|x: &[Tensor]| {
            let w = x[0].builder().new_variable("W2", &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert_eq!(
        err,
        TowerError::NewTrainableInReuseTower {
            tower: "InferenceTower".into(),
            variable: "InferenceTower/W2".into()
        }
    );
}

#[test]
fn new_trainable_in_shared_reuse_tower_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::new(2, Strategy::Shared),
        |x: &[Tensor]| {
            let b = x[0].builder();
            if ctx_of(&x[0]).index() == 0 {
                return dense(&x[0]);
            }
            // tower1 reuses tower0's variables: a `tf.Variable`-style trainable breaks that.
            let _s = b.variable_scope("extra");
            let w = b.new_variable("W", &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert!(
        matches!(&err, TowerError::NewTrainableInReuseTower { tower, .. } if tower == "tower1"),
        "{err:?}"
    );
}

#[test]
fn inference_tower_reusing_variables_passes_and_may_add_non_trainables() {
    let b = Builder::new();
    b.build_tower(TowerContext::training("", "", 0, 1), &sig(), |x| {
        dense(&x[0])
    })
    .expect("training tower");
    let h = build_inference_tower(&b, &sig(), "InferenceTower", "", &|x: &[Tensor]| {
        let counter = VarSpec::new(&[]).trainable(false);
        let c = x[0].builder().new_variable("counter", &counter);
        dense(&x[0]) + c
    })
    .expect("reuse is respected");
    let g = b.finish().expect("valid graph");
    assert_eq!(var_names(&g), ["W", "InferenceTower/counter"]);
    assert!(h.own_trainable_variables(&g).is_empty());
}

// ---- rule: trainable names start with the tower's variable scope --------------------------

#[test]
fn trainable_outside_the_tower_variable_scope_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::new(2, Strategy::Replicated),
        |x: &[Tensor]| {
            let i = ctx_of(&x[0]).index();
            let w = x[0]
                .builder()
                .get_variable_by_full_name(&format!("extra{i}/W"), &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert_eq!(
        err,
        TowerError::VariableOutsideScope {
            variable: "extra1/W".into(),
            vs_name: "tower1".into()
        }
    );
}

#[test]
fn trainable_inside_the_tower_variable_scope_passes() {
    let r = replicate(
        &sig(),
        &Replication::new(2, Strategy::Replicated),
        |x: &[Tensor]| {
            let vs = ctx_of(&x[0]).vs_name().to_string();
            let full = towerpack::tower::join_scope(&vs, "extra/W");
            let w = x[0].builder().get_variable_by_full_name(&full, &weight());
            x[0].matmul(&w).sum()
        },
    )
    .expect("names under the tower's variable scope");
    assert_eq!(var_names(&r.graph), ["extra/W", "tower1/extra/W"]);
}

// ---- rule: no variable-scope name twice ---------------------------------------------------

#[test]
fn repeating_the_tower_variable_scope_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::new(2, Strategy::Replicated),
        |x: &[Tensor]| {
            let b = x[0].builder();
            let ctx = ctx_of(&x[0]);
            let _a = b.variable_scope("a");
            let name = towerpack::tower::join_scope(ctx.vs_name(), "W");
            let w = b.get_variable(&name, &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert_eq!(
        err,
        TowerError::DuplicateScopeName {
            variable: "tower1/a/tower1/W".into(),
            scope: "tower1".into()
        }
    );
}

#[test]
fn nested_scopes_without_repetition_pass() {
    let r = replicate(
        &sig(),
        &Replication::new(2, Strategy::Replicated),
        |x: &[Tensor]| {
            let b = x[0].builder();
            let _a = b.variable_scope("a");
            let _inner = b.variable_scope("a");
            dense(&x[0])
        },
    )
    .expect("a/a is two scopes the function opened, not the tower scope twice");
    assert_eq!(var_names(&r.graph), ["a/a/W", "tower1/a/a/W"]);
}

// ---- rule: trainable names do not depend on the name scope --------------------------------

#[test]
fn variable_named_by_the_tower_name_scope_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::new(2, Strategy::Shared),
        |x: &[Tensor]| {
            let w = x[0].builder().new_variable("W", &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert_eq!(
        err,
        TowerError::NameScopeDependent {
            variable: "tower0/W".into(),
            name_scope: "tower0".into(),
            variable_scope: String::new()
        }
    );
}

#[test]
fn variable_named_by_a_user_name_scope_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::single(),
        |x: &[Tensor]| {
            let b = x[0].builder();
            let _ns = b.name_scope("block");
            let w = b.new_variable("W", &weight());
            x[0].matmul(&w).sum()
        },
    ));
    assert!(
        matches!(&err, TowerError::NameScopeDependent { variable, .. } if variable == "block/W"),
        "{err:?}"
    );
}

#[test]
fn get_variable_ignores_name_scopes() {
    let r = replicate(
        &sig(),
        &Replication::new(2, Strategy::Shared),
        |x: &[Tensor]| {
            let _ns = x[0].builder().name_scope("block");
            dense(&x[0])
        },
    )
    .expect("variable names follow variable scopes only");
    assert_eq!(var_names(&r.graph), ["W"]);
    assert!(r.graph.find("tower1/block/MatMul").is_some());
}

// ---- rule: never change the reuse of a scope the function did not open -----------------

#[test]
fn reusing_the_tower_scope_is_refused() {
    let err = rule(replicate(
        &sig(),
        &Replication::single(),
        |x: &[Tensor]| {
            x[0].builder().reuse_variables();
            dense(&x[0])
        },
    ));
    assert_eq!(
        err,
        TowerError::ForeignScopeReuse {
            scope: String::new()
        }
    );
}

#[test]
fn reusing_a_scope_the_function_opened_passes() {
    let r = replicate(&sig(), &Replication::single(), |x: &[Tensor]| {
        let b = x[0].builder();
        let first = {
            let _s = b.variable_scope("shared");
            dense(&x[0])
        };
        let second = {
            let _s = b.variable_scope("shared");
            b.reuse_variables();
            dense(&x[0])
        };
        let third = {
            let _s = b.variable_scope_with_reuse("shared", true);
            dense(&x[0])
        };
        first + second + third
    })
    .expect("reuse on own scopes");
    assert_eq!(var_names(&r.graph), ["shared/W"]);
}

// ---- rule: "tower" is reserved -------------------------------------------------------------

#[test]
fn reserved_word_in_scopes_and_variables_is_refused() {
    type Case = (&'static str, fn(&Tensor) -> Tensor, NameKind, &'static str);
    let cases: [Case; 4] = [
        (
            "variable scope",
            |x| {
                let _s = x.builder().variable_scope("my_tower");
                dense(x)
            },
            NameKind::VariableScope,
            "my_tower",
        ),
        (
            "name scope",
            |x| {
                let _s = x.builder().name_scope("Tower2");
                dense(x)
            },
            NameKind::NameScope,
            "Tower2",
        ),
        (
            "variable",
            |x| {
                let w = x.builder().get_variable("towering", &weight());
                x.matmul(&w).sum()
            },
            NameKind::Variable,
            "towering",
        ),
        (
            "layer",
            |x| FullyConnected("tower_fc", x).units(2).build().sum(),
            NameKind::VariableScope,
            "tower_fc",
        ),
    ];
    for (what, f, kind, name) in cases {
        let err = rule(replicate(
            &sig(),
            &Replication::single(),
            |x: &[Tensor]| f(&x[0]),
        ));
        assert_eq!(
            err,
            TowerError::ReservedName {
                kind,
                name: name.into()
            },
            "{what}"
        );
    }
}

#[test]
fn ordinary_names_pass_and_the_word_is_free_outside_towers() {
    let r = replicate(&sig(), &Replication::single(), |x: &[Tensor]| {
        FullyConnected("fc", &x[0]).units(2).build().sum()
    })
    .expect("ordinary names");
    assert_eq!(var_names(&r.graph), ["fc/W", "fc/b"]);

    let b = Builder::new();
    let _s = b.variable_scope("tower_sync");
    let v = b.get_variable("towerish", &weight());
    assert!(!v.is_poisoned(), "{:?}", b.error());
}

// ---- contexts cannot nest --------------------------------------------------------------

#[test]
fn tower_contexts_cannot_nest() {
    let b = Builder::new();
    let result = b.build_tower(TowerContext::training("tower0", "", 0, 1), &sig(), |x| {
        let inner = x[0].builder().build_tower(
            TowerContext::inference("InferenceTower", ""),
            &sig(),
            |y| dense(&y[0]),
        );
        assert!(inner.is_err());
        dense(&x[0])
    });
    assert_eq!(
        rule(result),
        TowerError::NestedTowerContext {
            outer: "tower0".into(),
            inner: "InferenceTower".into()
        }
    );
}

#[test]
fn inconsistent_contexts_are_refused() {
    let b = Builder::new();
    let under_reuse = TowerContext::training("tower1", "tower1", 1, 2).with_reuse(true);
    assert_eq!(
        rule(b.enter_tower(under_reuse).map(|_| ())),
        TowerError::VariableScopeUnderReuse {
            tower: "tower1".into(),
            vs_name: "tower1".into()
        }
    );

    let b = Builder::new();
    let _open = b.variable_scope("outer");
    assert_eq!(
        rule(
            b.enter_tower(TowerContext::training("tower0", "", 0, 1))
                .map(|_| ())
        ),
        TowerError::TowerInsideScope {
            tower: "tower0".into(),
            scope: "outer".into()
        }
    );
}
