//! Lowering of the data-parallel trainers' graphs: each bucket of variables is updated by ONE
//! fused kernel (per replica's device) that averages every tower's gradient arena and applies
//! the optimizer, instead of one operation per variable; the parameter server's variables and
//! kernels sit on its device; compiled multi-device steps match the reference executor; and a
//! snapshot shows the 2-tower replicated program.

use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::lower::{KernelKind, LowerOptions, Program, Storage, lower};
use towerpack::optim::Optimizer;
use towerpack::train::*;

use crate::training_graphs;

use training_graphs::{BATCH, Built, build as build_graph, feeds, mlp};

/// The training graph `strategy` builds for the small MLP with momentum SGD.
fn build(strategy: &dyn TowerStrategy) -> Built {
    let m = mlp();
    let model = ModelFn::new(
        m.inputs(),
        move |x| m.build(x),
        Optimizer::momentum(0.1, 0.9),
    );
    build_graph(model, |setup| {
        let built = strategy.build(setup).expect("build");
        (built.built.towers, built.train_op)
    })
}

fn two_towers(bucket_bytes: Option<usize>) -> TowerPlacement {
    TowerPlacement {
        devices: TowerDevices::Count(2),
        bucket_bytes,
    }
}

fn replicated(bucket_bytes: Option<usize>) -> ReplicatedTowers {
    ReplicatedTowers::over(two_towers(bucket_bytes))
}

fn parameter_server(device: ParameterDevice) -> ParameterServerTowers {
    ParameterServerTowers {
        towers: two_towers(None),
        parameter_device: Some(device),
    }
}

fn lowered(b: &Built, bucket_bytes: usize) -> Program {
    let options = LowerOptions {
        bucket_bytes,
        ..LowerOptions::default()
    };
    lower(&b.graph, &b.step, BATCH, &options).expect("lower")
}

/// Kernels writing a variable's state.
fn updates(p: &Program) -> Vec<usize> {
    (0..p.kernels.len())
        .filter(|&i| {
            p.kernels[i]
                .outputs
                .iter()
                .any(|b| matches!(p.buffer(*b).storage, Storage::State { .. }))
        })
        .collect()
}

#[test]
fn replicated_towers_update_each_bucket_with_one_kernel_per_device() {
    let b = build(&replicated(None));
    // fc0/W + fc0/b = 576 bytes, linear/W + linear/b = 272 bytes.
    for (bucket_bytes, buckets) in [(1 << 20, 1), (600, 2)] {
        let p = lowered(&b, bucket_bytes);
        let updates = updates(&p);
        assert_eq!(
            updates.len(),
            2 * buckets,
            "one per bucket and replica:\n{p}"
        );
        assert_eq!(p.buckets.len(), 2 * buckets, "{p}");
        for bucket in &p.buckets {
            let k = &p.kernels[bucket.kernel as usize];
            assert!(updates.contains(&(bucket.kernel as usize)));
            assert_eq!(bucket.arenas.len(), 2, "every tower's arena: {k}");
            let devices: Vec<u16> = bucket
                .arenas
                .iter()
                .map(|a| match p.buffer(*a).storage {
                    Storage::Scratch { device, .. } => device,
                    _ => panic!("arena not in scratch"),
                })
                .collect();
            assert_eq!(devices, vec![0, 1], "tower t's arena on device t");
            let KernelKind::Elementwise { shape, .. } = &k.kind else {
                panic!("{k}")
            };
            assert_eq!(shape, &vec![bucket.len]);
            // Each replica's weights and momentum slots.
            let replica = if k.device == 0 { "" } else { "tower1/" };
            let names: Vec<Vec<&str>> = bucket
                .outputs
                .iter()
                .map(|family| {
                    family
                        .iter()
                        .map(|v| b.graph.variable(*v).name.as_str())
                        .collect()
                })
                .collect();
            assert_eq!(names.len(), 2, "{names:?}");
            for (slot, weight) in names[0].iter().zip(&names[1]) {
                assert!(weight.starts_with(replica), "dev{}: {weight}", k.device);
                assert!(!weight.starts_with("tower") || !replica.is_empty());
                assert_eq!(*slot, format!("{weight}/Momentum"));
            }
        }
        // The replicas' kernels of a bucket read the same two arenas.
        let mut arenas: Vec<_> = p.buckets.iter().map(|bk| bk.arenas.clone()).collect();
        arenas.sort();
        arenas.dedup();
        assert_eq!(arenas.len(), buckets);
    }
}

#[test]
fn the_parameter_server_updates_once_on_its_device() {
    for (device, logical) in [
        (ParameterDevice::Tower(1), 1u16),
        (ParameterDevice::Host, 2u16),
    ] {
        let b = build(&parameter_server(device));
        let p = lowered(&b, 1 << 20);
        let updates = updates(&p);
        assert_eq!(updates.len(), 1, "{device:?}:\n{p}");
        let k = &p.kernels[updates[0]];
        assert_eq!(k.device, logical, "{device:?}");
        assert_eq!(p.buckets[0].arenas.len(), 2);
        let w = b.graph.find_variable("fc0/W").expect("W");
        assert_eq!(
            p.state.slot(w).device,
            logical,
            "variables live on the PS device"
        );
        assert_eq!(p.devices(), usize::from(logical).max(1) + 1);
    }
}

#[test]
fn compiled_data_parallel_steps_match_the_reference() {
    let strategies: Vec<Box<dyn TowerStrategy>> = vec![
        Box::new(replicated(Some(600))),
        Box::new(parameter_server(ParameterDevice::Host)),
        Box::new(AsyncTowers::over(two_towers(None))),
    ];
    for strategy in strategies {
        let b = build(strategy.as_ref());
        let mut reference = ReferenceSession::new(b.graph.clone()).expect("reference");
        let options = CpuOptions {
            threads: 2,
            lower: LowerOptions {
                bucket_bytes: 600,
                ..LowerOptions::default()
            },
            ..CpuOptions::default()
        };
        let mut cpu = CpuSession::new(b.graph.clone(), options).expect("cpu");
        reference.initialize_variables(3).expect("init");
        cpu.initialize_variables(3).expect("init");
        for s in 0..3 {
            let f = feeds(&b, s);
            let want = reference.run(&b.step, &f).expect("reference");
            let got = cpu.run(&b.step, &f).expect("cpu");
            assert!(
                (want[0].to_f64_vec()[0] - got[0].to_f64_vec()[0]).abs() < 1e-5,
                "{}: cost at step {s}",
                strategy.name()
            );
        }
        for (id, def) in b.graph.variable_ids() {
            let (w, g) = (
                reference.read_variable(id).expect("ref").to_f64_vec(),
                cpu.read_variable(id).expect("cpu").to_f64_vec(),
            );
            let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            for (x, y) in w.iter().zip(&g) {
                assert!(
                    (x - y).abs() <= 1e-5 * scale,
                    "{}: {}: {y} vs reference {x}",
                    strategy.name(),
                    def.name
                );
            }
        }
    }
}

/// The program, then each bucket: its kernel, arenas, and members at their offsets.
fn describe(b: &Built, p: &Program) -> String {
    let mut text = format!("{p}\nbuckets:\n");
    for bucket in &p.buckets {
        let arenas: Vec<String> = bucket.arenas.iter().map(|a| a.to_string()).collect();
        let members: Vec<String> = (0..bucket.offsets.len())
            .map(|i| {
                let vars: Vec<&str> = bucket
                    .outputs
                    .iter()
                    .map(|family| b.graph.variable(family[i]).name.as_str())
                    .collect();
                format!("{}@{}", vars.join(" + "), bucket.offsets[i])
            })
            .collect();
        text.push_str(&format!(
            "  k{} dev{}: {} elements, arenas [{}], members [{}]\n",
            bucket.kernel,
            p.kernels[bucket.kernel as usize].device,
            bucket.len,
            arenas.join(", "),
            members.join(", ")
        ));
    }
    text
}

#[test]
fn snapshot_of_the_two_tower_replicated_program() {
    let b = build(&replicated(None));
    let p = lowered(&b, 600);
    let text = describe(&b, &p);
    insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("lower_two_tower_replicated_program", text);
    });
}
