//! The models of `towerpack::models` build with tensorpack's variable names and shapes: the
//! ResNet-20 trainable list is derived here independently from the architecture description.

use towerpack::dsl::prelude::*;
use towerpack::ir::{Graph, verify};
use towerpack::models::{CifarResNet, ConvNet, Mlp};
use towerpack::tower::{MOVING_SUMMARY, UPDATE_OPS, VarCollection};

fn trainables(g: &Graph) -> Vec<(String, String)> {
    VarCollection::Trainable
        .variables(g)
        .into_iter()
        .map(|id| {
            let d = g.variable(id);
            (d.name.clone(), d.ty.to_string())
        })
        .collect()
}

fn f32s(name: &str, dims: &[usize]) -> (String, String) {
    let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    (name.to_string(), format!("f32[{}]", dims.join(",")))
}

/// ResNet-(6n+2)'s trainable variables in creation order, from the paper's description.
fn expected_resnet(n: usize) -> Vec<(String, String)> {
    let mut v = vec![f32s("conv0/W", &[3, 3, 3, 16])];
    let bn = |v: &mut Vec<(String, String)>, scope: &str, c: usize| {
        v.push(f32s(&format!("{scope}/bn/beta"), &[c]));
        v.push(f32s(&format!("{scope}/bn/gamma"), &[c]));
    };
    bn(&mut v, "conv0", 16);
    let mut channels = 16;
    for stage in 1..=3 {
        for k in 0..n {
            let block = format!("res{stage}.{k}");
            let increase = stage > 1 && k == 0;
            let out = if increase { channels * 2 } else { channels };
            if !(stage == 1 && k == 0) {
                bn(&mut v, &block, channels);
            }
            v.push(f32s(&format!("{block}/conv1/W"), &[3, 3, channels, out]));
            bn(&mut v, &format!("{block}/conv1"), out);
            v.push(f32s(&format!("{block}/conv2/W"), &[3, 3, out, out]));
            channels = out;
        }
    }
    bn(&mut v, "bnlast", 64);
    v.push(f32s("linear/W", &[64, 10]));
    v.push(f32s("linear/b", &[10]));
    v
}

#[test]
fn resnet20_has_exactly_the_expected_trainable_variables() {
    let model = CifarResNet::new(3);
    let r = replicate(&model.inputs(), &Replication::single(), |x| model.build(x)).expect("build");
    let g = &r.graph;
    verify(g).expect("verified");
    let got = trainables(g);
    assert_eq!(got, expected_resnet(3));
    assert_eq!(got.len(), 59);
    // 0.27M parameters, as the paper's table 6 says for ResNet-20.
    let params: usize = VarCollection::Trainable
        .variables(g)
        .iter()
        .map(|&id| g.variable(id).ty.shape.num_elements().unwrap_or(0))
        .sum();
    assert!((265_000..275_000).contains(&params), "{params}");
    // Every BN has its two EMAs in MODEL_VARIABLES and its two updates in UPDATE_OPS.
    let model_vars = VarCollection::Model.variables(g).len();
    assert_eq!(model_vars, 2 * 19);
    assert_eq!(g.collection(UPDATE_OPS).len(), 2 * 19);
    // Convolutions use fan-out He init and no bias; the classifier keeps fan-in.
    let init = |n: &str| g.variable(g.find_variable(n).expect(n)).init.clone();
    assert_eq!(
        init("res2.0/conv1/W"),
        variance_scaling(2.0, FanMode::FanOut)
    );
    assert_eq!(init("linear/W"), variance_scaling(2.0, FanMode::FanIn));
    assert!(g.find_variable("conv0/b").is_none());
}

#[test]
fn resnet_shapes_and_named_tensors() {
    let model = CifarResNet::new(1);
    let plan = Replication::new(2, Strategy::Shared).with_inference(INFERENCE_TOWER);
    let r = replicate(&model.inputs(), &plan, |x| model.build(x)).expect("build");
    let g = &r.graph;
    assert_eq!(trainables(g), expected_resnet(1));
    let ty = |h: &TowerHandle, name: &str| {
        let v = h.get_tensor(g, name).unwrap_or_else(|| panic!("{name}"));
        g.value_type(v).to_string()
    };
    for h in r.training.iter().chain(&r.inference) {
        assert_eq!(ty(h, "res2.0/add"), "f32[N,16,16,32]");
        assert_eq!(ty(h, "res3.0/conv2/output"), "f32[N,8,8,64]");
        assert_eq!(ty(h, "gap/output"), "f32[N,64]");
        assert_eq!(ty(h, "wrong_vector"), "f32[N]");
        assert_eq!(ty(h, "cross_entropy_loss"), "f32[]");
        assert_eq!(ty(h, "cost"), "f32[]");
    }
    // Moving summaries (train_error, cross_entropy_loss, wd_cost) from tower0 only.
    assert_eq!(g.collection(MOVING_SUMMARY).len(), 3);
}

#[test]
fn resnet_reads_like_its_description() {
    // `res{stage}.{k}` blocks; the shortcut of an increasing block pools and pads channels.
    let model = CifarResNet::new(2);
    let r = replicate(&model.inputs(), &Replication::single(), |x| model.build(x)).expect("build");
    let g = &r.graph;
    let ty = |n: &str| g.node(g.find(n).unwrap_or_else(|| panic!("{n}"))).outputs[0].to_string();
    assert_eq!(ty("res2.0/pool/output"), "f32[N,16,16,16]");
    assert_eq!(ty("res2.0/Pad"), "f32[N,16,16,32]");
    assert!(
        g.find("res1.0/bn/output").is_none(),
        "no pre-activation in the first block"
    );
    assert!(g.find("res1.1/bn/output").is_some());
    assert!(g.find("truediv").is_some(), "image / 128");
}

#[test]
fn mlp_and_convnet_variables() {
    let mlp = Mlp::default();
    let r = replicate(&mlp.inputs(), &Replication::single(), |x| mlp.build(x)).expect("mlp");
    assert_eq!(
        trainables(&r.graph),
        [
            f32s("fc0/W", &[784, 512]),
            f32s("fc0/b", &[512]),
            f32s("fc1/W", &[512, 512]),
            f32s("fc1/b", &[512]),
            f32s("linear/W", &[512, 10]),
            f32s("linear/b", &[10]),
        ]
    );
    let small = Mlp {
        input_shape: vec![5],
        hidden: vec![7],
        classes: 3,
        weight_decay: 0.0,
        dropout_rate: 0.0,
    };
    let r =
        replicate(&small.inputs(), &Replication::single(), |x| small.build(x)).expect("small mlp");
    assert_eq!(trainables(&r.graph)[0], f32s("fc0/W", &[5, 7]));

    let net = ConvNet::default();
    let r = replicate(&net.inputs(), &Replication::single(), |x| net.build(x)).expect("convnet");
    let names: Vec<String> = trainables(&r.graph).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "conv0/W",
            "bn0/bn/beta",
            "bn0/bn/gamma",
            "conv1/W",
            "bn1/bn/beta",
            "bn1/bn/gamma",
            "fc0/W",
            "fc0/b",
            "linear/W",
            "linear/b"
        ]
    );
    let fc0 = r.graph.find_variable("fc0/W").expect("fc0/W");
    assert_eq!(r.graph.variable(fc0).ty.to_string(), "f32[3136,128]");
    assert!(r.graph.find("dropout/RandomUniform").is_some());
}
