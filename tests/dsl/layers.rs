//! Layers: variable names, shapes and initializers as tensorpack's, argscope defaults and
//! overrides, missing arguments, BatchNorm and Dropout in training and inference towers.

use towerpack::dsl::prelude::*;
use towerpack::ir::{Distribution, Graph, Op};
use towerpack::tower::UPDATE_OPS;

fn image_sig(h: usize, c: usize) -> Vec<InputSpec> {
    vec![InputSpec::new(
        "image",
        DType::F32,
        Shape::batched(&[h, h, c]),
    )]
}

/// Builds one training tower (no prefix) around `f`, whose output is summed into a cost.
fn build(sig: &[InputSpec], f: impl Fn(&Tensor) -> Tensor) -> Result<Graph, DslError> {
    let b = Builder::with_seed(11);
    b.build_tower(TowerContext::training("", "", 0, 1), sig, |x| {
        f(&x[0]).sum()
    })?;
    b.finish()
}

fn var<'g>(g: &'g Graph, name: &str) -> &'g towerpack::ir::VariableDef {
    let id = g
        .find_variable(name)
        .unwrap_or_else(|| panic!("no variable {name}: {:?}", names(g)));
    g.variable(id)
}

fn names(g: &Graph) -> Vec<String> {
    g.variables().iter().map(|v| v.name.clone()).collect()
}

fn out_type(g: &Graph, node: &str) -> String {
    let id = g.find(node).unwrap_or_else(|| panic!("no node {node}"));
    g.node(id).outputs[0].to_string()
}

#[test]
fn conv2d_follows_tensorpack_names_shapes_and_init() {
    let g = build(&image_sig(8, 3), |x| {
        Conv2D("conv0", x).filters(16).kernel_size(3).build()
    })
    .expect("build");
    assert_eq!(names(&g), ["conv0/W", "conv0/b"]);
    let w = var(&g, "conv0/W");
    assert_eq!(w.ty.to_string(), "f32[3,3,3,16]");
    assert_eq!(
        w.init,
        Initializer::VarianceScaling {
            scale: 2.0,
            mode: FanMode::FanIn,
            distribution: Distribution::Normal
        }
    );
    assert!(w.flags.trainable);
    assert_eq!(var(&g, "conv0/b").ty.to_string(), "f32[16]");
    assert_eq!(out_type(&g, "conv0/output"), "f32[N,8,8,16]");
}

#[test]
fn conv2d_strides_padding_groups_and_no_bias() {
    let g = build(&image_sig(9, 4), |x| {
        Conv2D("c", x)
            .filters(6)
            .kernel_size((3, 1))
            .strides(2)
            .padding(Padding::Valid)
            .split(2)
            .use_bias(false)
            .activation(relu)
            .build()
    })
    .expect("build");
    assert_eq!(names(&g), ["c/W"]);
    assert_eq!(var(&g, "c/W").ty.to_string(), "f32[3,1,2,6]");
    assert_eq!(out_type(&g, "c/output"), "f32[N,4,5,6]");
    assert!(g.find("c/Relu").is_some());
}

#[test]
fn conv2d_transpose_upsamples() {
    let g = build(&image_sig(4, 8), |x| {
        Conv2DTranspose("deconv", x)
            .filters(3)
            .kernel_size(5)
            .strides(2)
            .build()
    })
    .expect("build");
    assert_eq!(var(&g, "deconv/W").ty.to_string(), "f32[5,5,3,8]");
    assert_eq!(out_type(&g, "deconv/output"), "f32[N,8,8,3]");
}

#[test]
fn fully_connected_flattens_its_input() {
    let g = build(&image_sig(2, 3), |x| {
        FullyConnected("fc", x).units(7).build()
    })
    .expect("build");
    assert_eq!(var(&g, "fc/W").ty.to_string(), "f32[12,7]");
    assert_eq!(out_type(&g, "fc/output"), "f32[N,7]");
}

#[test]
fn missing_required_arguments_name_the_layer() {
    let err = build(&image_sig(4, 3), |x| {
        Conv2D("conv0", x).kernel_size(3).build()
    })
    .expect_err("no filters");
    assert_eq!(
        err,
        DslError::Layer {
            layer: "conv0".into(),
            kind: "Conv2D",
            message: "missing required argument `filters`".into()
        }
    );
    let err = build(&image_sig(4, 3), |x| {
        let flat = x.flatten();
        Conv2D("conv1", flat).filters(2).kernel_size(3).build()
    })
    .expect_err("not NHWC");
    assert!(
        err.to_string().contains("conv1") && err.to_string().contains("[N,48]"),
        "{err}"
    );
}

#[test]
fn argscope_supplies_defaults_and_explicit_arguments_win() {
    let g = build(&image_sig(8, 3), |x| {
        let _outer = argscope(Conv2D::defaults().kernel_size(5).use_bias(false));
        let a = Conv2D("a", x).filters(4).build();
        let b = Conv2D("b", &a).filters(4).kernel_size(1).build();
        let c = {
            let _inner = argscope(Conv2D::defaults().kernel_size(3).use_bias(true));
            Conv2D("c", &b).filters(4).build()
        };
        // After the inner guard drops, the outer defaults are back.
        Conv2D("d", c).filters(4).build()
    })
    .expect("build");
    assert_eq!(var(&g, "a/W").ty.to_string(), "f32[5,5,3,4]");
    assert_eq!(var(&g, "b/W").ty.to_string(), "f32[1,1,4,4]");
    assert_eq!(var(&g, "c/W").ty.to_string(), "f32[3,3,4,4]");
    assert_eq!(var(&g, "d/W").ty.to_string(), "f32[5,5,4,4]");
    assert_eq!(names(&g), ["a/W", "b/W", "c/W", "c/b", "d/W"]);
    // No argscope outside the closure.
    let g = build(&image_sig(8, 3), |x| {
        Conv2D("e", x).filters(2).kernel_size(3).build()
    })
    .expect("build");
    assert!(g.find_variable("e/b").is_some());
}

#[test]
fn batchnorm_variables_and_collections() {
    let g = build(&image_sig(4, 6), |x| BatchNorm("bn", x).build()).expect("build");
    assert_eq!(
        names(&g),
        ["bn/beta", "bn/gamma", "bn/mean/EMA", "bn/variance/EMA"]
    );
    for ema in ["bn/mean/EMA", "bn/variance/EMA"] {
        let f = var(&g, ema).flags;
        assert!(!f.trainable && f.model, "{ema}");
    }
    assert_eq!(var(&g, "bn/gamma").init, Initializer::Ones);
    assert_eq!(var(&g, "bn/variance/EMA").init, Initializer::Ones);
    assert_eq!(g.collection(UPDATE_OPS).len(), 2);
    assert!(g.find("bn/moments").is_some());
    assert_eq!(out_type(&g, "bn/output"), "f32[N,4,4,6]");
}

#[test]
fn frozen_batchnorm_uses_the_ema_and_updates_nothing() {
    let g = build(&image_sig(4, 6), |x| {
        BatchNorm("bn", x).training(false).center(false).build()
    })
    .expect("build");
    assert_eq!(names(&g), ["bn/gamma", "bn/mean/EMA", "bn/variance/EMA"]);
    assert!(g.collection(UPDATE_OPS).is_empty());
    assert!(g.find("bn/moments").is_none());
}

#[test]
fn dropout_is_identity_in_inference_and_seeded_per_tower_and_layer() {
    let sig = vec![InputSpec::new("x", DType::F32, Shape::batched(&[10]))];
    let tower = |x: &[Tensor]| {
        let a = Dropout("drop_a", &x[0]).rate(0.25).build();
        let b = Dropout("drop_b", a).build();
        b.sum()
    };
    let plan = Replication::new(2, Strategy::Shared)
        .with_inference(INFERENCE_TOWER)
        .with_seed(5);
    let r = replicate(&sig, &plan, tower).expect("build");
    let g = &r.graph;
    let seed = |name: &str| match g.find(name).map(|id| &g.node(id).op) {
        Some(Op::RandomUniform { seed }) => *seed,
        other => panic!("{name}: {other:?}"),
    };
    let seeds = [
        seed("tower0/drop_a/RandomUniform"),
        seed("tower0/drop_b/RandomUniform"),
        seed("tower1/drop_a/RandomUniform"),
    ];
    assert!(seeds[0] != seeds[1] && seeds[0] != seeds[2] && seeds[1] != seeds[2]);
    // The counter is the global step.
    let rng = g.find("tower0/drop_a/RandomUniform").expect("rng");
    let counter = g.inputs(rng)[1];
    assert_eq!(g.node(counter.node).name, "tower0/global_step");
    // Inference: no random node; the layer output is an identity of its input.
    let infer_nodes: Vec<&str> = g
        .node_ids()
        .map(|id| g.node(id).name.as_str())
        .filter(|n| n.starts_with("InferenceTower/"))
        .collect();
    assert!(
        !infer_nodes.iter().any(|n| n.contains("RandomUniform")),
        "{infer_nodes:?}"
    );
    let out = g.find("InferenceTower/drop_a/output").expect("output");
    assert_eq!(g.node(out).op, Op::Identity);
    assert_eq!(
        g.node(g.inputs(out)[0].node).name,
        "InferenceTower/x",
        "dropout passes its input through"
    );
    // The same graph seed gives the same seeds; another gives different ones.
    let again = replicate(&sig, &plan, tower).expect("rebuild");
    let id = again
        .graph
        .find("tower0/drop_a/RandomUniform")
        .expect("rng");
    assert_eq!(
        again.graph.node(id).op,
        Op::RandomUniform { seed: seeds[0] }
    );
    let other = replicate(&sig, &plan.clone().with_seed(6), tower).expect("reseed");
    let id = other
        .graph
        .find("tower0/drop_a/RandomUniform")
        .expect("rng");
    assert_ne!(
        other.graph.node(id).op,
        Op::RandomUniform { seed: seeds[0] }
    );
}

#[test]
fn dropout_rejects_a_rate_of_one() {
    let sig = vec![InputSpec::new("x", DType::F32, Shape::batched(&[3]))];
    let err = build(&sig, |x| Dropout("d", x).rate(1.0).build()).expect_err("rate 1");
    assert!(
        matches!(
            err,
            DslError::Layer {
                kind: "Dropout",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn regularize_cost_matches_by_regex_search() {
    let sig = vec![InputSpec::new("x", DType::F32, Shape::batched(&[4]))];
    let b = Builder::new();
    b.build_tower(TowerContext::training("", "", 0, 1), &sig, |x| {
        let h = FullyConnected("fc0", &x[0]).units(3).build();
        let h = FullyConnected("fc1", h).units(2).build();
        let reg = regularize_cost("fc1/W|fc0/b", 0.5);
        h.sum() + reg
    })
    .expect("build");
    let g = b.finish().expect("graph");
    let squared: Vec<String> = g
        .node_ids()
        .filter(|&id| {
            g.node(id)
                .name
                .starts_with("regularize_cost_internals/Square")
        })
        .map(|id| g.node(g.inputs(id)[0].node).name.clone())
        .collect();
    assert_eq!(squared, ["fc0/b", "fc1/W"]);
    assert!(g.find("regularize_cost").is_some());

    let b = Builder::new();
    let h = b
        .build_tower(TowerContext::inference("", ""), &sig, |x| {
            FullyConnected("fc", &x[0]).units(2).build().sum() + regularize_cost(".*", 1.0)
        })
        .expect("inference");
    let g = b.finish().expect("graph");
    let reg = g.find("regularize_cost").expect("zero");
    let src = g.inputs(reg)[0].node;
    assert!(
        matches!(g.node(src).op, Op::Constant { .. }),
        "0 in inference towers"
    );
    assert!(h.cost.is_none());
}

#[test]
fn leaky_relu_and_pooling() {
    let g = build(&image_sig(6, 2), |x| {
        let l = LeakyReLU("lrelu", x).alpha(0.2).build();
        let l = MaxPooling("pool", l).pool_size(2).build();
        let l = AvgPooling("avg", l)
            .pool_size(3)
            .strides(1)
            .padding(Padding::Same)
            .build();
        GlobalAvgPooling("gap", l).build()
    })
    .expect("build");
    assert_eq!(out_type(&g, "pool/output"), "f32[N,3,3,2]");
    assert_eq!(out_type(&g, "avg/output"), "f32[N,3,3,2]");
    assert_eq!(out_type(&g, "gap/output"), "f32[N,2]");
    let err = build(&image_sig(6, 2), |x| LeakyReLU("l", x).build()).expect_err("alpha");
    assert!(err.to_string().contains("alpha"), "{err}");
}
