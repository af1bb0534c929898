//! Snapshots of the textual IR of model towers: an MLP tower, the CIFAR ResNet-20 tower, and
//! ResNet-20 replicated into two shared training towers plus an inference tower.

use towerpack::dsl::prelude::*;
use towerpack::ir::text::print;
use towerpack::models::{CifarResNet, Mlp};

fn snapshot(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn mlp_tower() {
    let mlp = Mlp::default();
    let r = replicate(&mlp.inputs(), &Replication::single(), |x| mlp.build(x)).expect("build");
    snapshot("dsl_mlp_tower", &print(&r.graph));
}

#[test]
fn resnet20_tower() {
    let model = CifarResNet::new(3);
    let r = replicate(&model.inputs(), &Replication::single(), |x| model.build(x)).expect("build");
    snapshot("dsl_resnet20_tower", &print(&r.graph));
}

#[test]
fn resnet20_two_shared_towers_and_an_inference_tower() {
    let model = CifarResNet::new(3);
    let plan = Replication::new(2, Strategy::Shared).with_inference(INFERENCE_TOWER);
    let r = replicate(&model.inputs(), &plan, |x| model.build(x)).expect("build");
    snapshot("dsl_resnet20_replicated", &print(&r.graph));
}
