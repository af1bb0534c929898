//! `graph!`: keyword layer calls expand to the builder API (the two build identical graphs),
//! scope / name_scope / argscope blocks, and plain Rust inside the body.

use towerpack::dsl::prelude::*;
use towerpack::graph;
use towerpack::ir::Graph;

fn sig() -> Vec<InputSpec> {
    vec![
        InputSpec::new("image", DType::F32, Shape::batched(&[8, 8, 3])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
    ]
}

fn build(f: impl Fn(&[Tensor]) -> Tensor) -> Graph {
    let r = replicate(&sig(), &Replication::single(), f);
    r.unwrap_or_else(|e| panic!("{e}")).graph
}

/// Every node (name, op, types, inputs) and variable, in order: two graphs built the same way
/// have the same summary.
fn summary(g: &Graph) -> Vec<String> {
    let nodes = g.node_ids().map(|id| {
        let n = g.node(id);
        let ins: Vec<String> = g.inputs(id).iter().map(|v| g.value_name(*v)).collect();
        format!(
            "{} = {:?} {:?} ({})",
            n.name,
            n.op,
            n.outputs,
            ins.join(", ")
        )
    });
    let vars = g.variables().iter().map(|v| format!("{v:?}"));
    nodes.chain(vars).collect()
}

fn var_names(g: &Graph) -> Vec<String> {
    g.variables().iter().map(|v| v.name.clone()).collect()
}

#[test]
fn keyword_calls_expand_to_the_builder_api() {
    let with_macro = build(|x| {
        let (image, label) = (&x[0], &x[1]);
        graph! {
            let l = Conv2D("conv0", image / 128.0, filters = 4, kernel_size = 3, use_bias = false);
            let l = BNReLU("bn0", l);
            let l = MaxPooling("pool0", l, pool_size = 2);
            let logits = FullyConnected("linear", GlobalAvgPooling("gap", l), units = 5);
            sparse_softmax_cross_entropy(&logits, label)
        }
    });
    let by_hand = build(|x| {
        let (image, label) = (&x[0], &x[1]);
        let l = Conv2D("conv0", image / 128.0)
            .filters(4)
            .kernel_size(3)
            .use_bias(false)
            .build();
        let l = BNReLU("bn0", l).build();
        let l = MaxPooling("pool0", l).pool_size(2).build();
        let logits = FullyConnected("linear", GlobalAvgPooling("gap", l).build())
            .units(5)
            .build();
        sparse_softmax_cross_entropy(&logits, label)
    });
    assert_eq!(summary(&with_macro), summary(&by_hand));
    assert_eq!(
        var_names(&with_macro),
        [
            "conv0/W",
            "bn0/bn/beta",
            "bn0/bn/gamma",
            "bn0/bn/mean/EMA",
            "bn0/bn/variance/EMA",
            "linear/W",
            "linear/b"
        ]
    );
}

#[test]
fn scope_blocks_open_variable_scopes_with_static_and_dynamic_names() {
    let g = build(|x| {
        let image = &x[0];
        graph! {
            let l = scope "stage1" {
                let l = Conv2D("conv", image, filters = 2, kernel_size = 1);
                scope "inner" { Conv2D("conv", l, filters = 2, kernel_size = 1) }
            };
            let mut l = l;
            for k in 0..2 {
                let name = format!("block{k}");
                l = scope name { Conv2D("conv", l, filters = 2, kernel_size = 1) };
            }
            l = scope format!("res{}.{}", 3, 0) { Conv2D("conv", l, filters = 2, kernel_size = 1) };
            l.sum()
        }
    });
    assert_eq!(
        var_names(&g),
        [
            "stage1/conv/W",
            "stage1/conv/b",
            "stage1/inner/conv/W",
            "stage1/inner/conv/b",
            "block0/conv/W",
            "block0/conv/b",
            "block1/conv/W",
            "block1/conv/b",
            "res3.0/conv/W",
            "res3.0/conv/b",
        ]
    );
    assert!(g.find("stage1/inner/conv/Conv2D").is_some());
}

#[test]
fn scope_with_reuse_and_name_scope_blocks() {
    let g = build(|x| {
        let image = &x[0];
        graph! {
            let a = scope "shared" { Conv2D("conv", image, filters = 2, kernel_size = 1) };
            let b = scope "shared", reuse = true { Conv2D("conv", image, filters = 2, kernel_size = 1) };
            name_scope "extra" {
                (a + b).relu().sum()
            }
        }
    });
    assert_eq!(var_names(&g), ["shared/conv/W", "shared/conv/b"]);
    assert!(
        g.find("shared/conv/Conv2D_1").is_some(),
        "second call reused the variables"
    );
    assert!(g.find("extra/Relu").is_some());
}

#[test]
fn argscope_blocks_set_defaults_for_several_layers() {
    let g = build(|x| {
        let image = &x[0];
        graph! {
            argscope Conv2D(kernel_size = 5, use_bias = false), BatchNorm(center = false) {
                let l = Conv2D("a", image, filters = 2);
                let l = Conv2D("b", l, filters = 2, kernel_size = 1);
                BatchNorm("bn", l).sum()
            }
        }
    });
    assert_eq!(
        var_names(&g),
        ["a/W", "b/W", "bn/gamma", "bn/mean/EMA", "bn/variance/EMA"]
    );
    let shape = |n: &str| g.variable(g.find_variable(n).expect(n)).ty.to_string();
    assert_eq!(shape("a/W"), "f32[5,5,3,2]");
    assert_eq!(shape("b/W"), "f32[1,1,2,2]");
}

#[test]
fn plain_rust_works_inside() {
    let widths = [3usize, 4];
    let g = build(|x| {
        let image = &x[0];
        graph! {
            let conv = |name: &str, l: &Tensor, filters: usize| {
                Conv2D(name, l, filters = filters, kernel_size = 1)
            };
            let mut l = image.clone();
            for (i, &w) in widths.iter().enumerate() {
                l = conv(&format!("c{i}"), &l, w);
            }
            let maybe: Option<Tensor> = Some(l.clone());
            let l = match maybe {
                Some(t) if t.rank() == Some(4) => t,
                _ => l,
            };
            let l = if widths.len() > 1 { l.relu() } else { l };
            let act = towerpack::dsl::layers::FullyConnected("fc", l, units = 2, activation = Tensor::tanh);
            act.sum()
        }
    });
    assert_eq!(
        var_names(&g),
        ["c0/W", "c0/b", "c1/W", "c1/b", "fc/W", "fc/b"]
    );
    assert!(g.find("fc/Tanh").is_some());
}
