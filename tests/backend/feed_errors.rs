//! One suite, every backend: a wrong feed is the same typed error naming the input on the
//! reference executor, the CPU backend and the CUDA backend (on an emulated device), and a good
//! feed gives the same values.

use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{BackendError, Session};
use towerpack::dsl::prelude::*;
use towerpack::ir::{Graph, NodeId, Step, Value};
use towerpack::tensor::HostTensor;

/// `out[n] = image[n, 0] + image[n, 1] + label[n]` over inputs `image f32[N, 2]`,
/// `label i64[N]`.
fn graph() -> (Graph, NodeId, NodeId, Value) {
    let sig = [
        InputSpec::new("image", DType::F32, Shape::batched(&[2])),
        InputSpec::new("label", DType::I64, Shape::batched(&[])),
    ];
    let built = replicate(&sig, &Replication::single(), |x: &[Tensor]| {
        let out = (x[0].reduce_sum(&[1]) + x[1].cast(DType::F32)).named("out");
        // A tower function returns a scalar cost.
        out.reduce_sum(&[0]).named("cost")
    })
    .expect("graph");
    let g = built.graph;
    let node = |name: &str| g.find_value(name).expect(name).node;
    let (image, label) = (node("image"), node("label"));
    let out = g.find_value("out").expect("out");
    (g, image, label, out)
}

fn sessions(g: &Graph) -> Vec<(&'static str, Box<dyn Session>)> {
    vec![
        (
            "reference",
            Box::new(ReferenceSession::new(g.clone()).expect("reference")),
        ),
        (
            "cpu",
            Box::new(CpuSession::new(g.clone(), CpuOptions::default()).expect("cpu")),
        ),
        (
            "cuda-emu",
            Box::new(
                CudaSession::emulated(g.clone(), 1, CudaOptions::default())
                    .expect("cuda-emu (needs NVRTC: run the tests with `cargo xtask test`)"),
            ),
        ),
    ]
}

#[test]
fn every_backend_reports_bad_feeds_alike_and_computes_good_ones_alike() {
    let (g, image, label, out) = graph();
    let step = Step::fetch(vec![out]);
    let f32s = |shape: &[usize], v: Vec<f32>| HostTensor::from_f32(shape, v).expect("f32");
    let i64s = |shape: &[usize], v: Vec<i64>| HostTensor::from_i64(shape, v).expect("i64");
    for (name, mut s) in sessions(&g) {
        let good = [
            (image, f32s(&[2, 2], vec![1.0, 2.0, 3.0, 4.0])),
            (label, i64s(&[2], vec![10, 20])),
        ];
        let got = s
            .run(&step, &good)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got[0].to_f32_vec(), vec![13.0, 27.0], "{name}");

        let err = s
            .run(
                &step,
                &[
                    (image, f32s(&[2, 2], vec![0.0; 4])),
                    (label, i64s(&[3], vec![0; 3])),
                ],
            )
            .unwrap_err();
        assert_eq!(
            err,
            BackendError::BatchMismatch {
                input: "label".into(),
                expected: 2,
                got: 3
            },
            "{name}"
        );
        let err = s
            .run(
                &step,
                &[
                    (image, f32s(&[2, 3], vec![0.0; 6])),
                    (label, i64s(&[2], vec![0; 2])),
                ],
            )
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::FeedMismatch { input, expected, got }
                if input == "image" && expected == "f32[N,2]" && got == "f32[2,3]"),
            "{name}: {err}"
        );
        let err = s
            .run(&step, &[(out.node, f32s(&[2], vec![0.0; 2]))])
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::FeedNotInput { node } if node == "out"),
            "{name}: {err}"
        );
    }
}
