//! The GEMM cases of the TF32 and BF16/FP16 tests: graphs of matrix products and convolutions
//! with random feeds, each GEMM fetched with the same GEMM of its operands' absolute values (the
//! S of the error bounds), and sessions on the CPU and on the test device in a precision.

use crate::cuda_common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use towerpack::backend::Feed;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::driver::emulated::EmulatedDriver;
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::ir::*;
use towerpack::lower::{LowerOptions, Precision};
use towerpack::tensor::{DType, HostTensor};

/// A graph under construction with random feeds.
pub(crate) struct Case {
    pub(crate) g: Graph,
    pub(crate) feeds: Vec<Feed>,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) batch: usize,
    /// (result, S = the same product of absolute values, K, name) of every GEMM under test.
    pub(crate) gemms: Vec<(Value, Value, usize, String)>,
}

impl Case {
    pub(crate) fn new(seed: u64, batch: usize) -> Case {
        Case {
            g: Graph::new(),
            feeds: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            batch,
            gemms: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, name: &str, op: Op, ins: &[Value]) -> Value {
        let name = self.g.unique_name(name);
        Value::first(self.g.add_node(&name, op, ins).expect(&name))
    }

    /// A batched f32 input of `dims` with values from `value`.
    pub(crate) fn input_with(
        &mut self,
        dims: &[usize],
        mut value: impl FnMut(&mut ChaCha8Rng) -> f32,
    ) -> Value {
        let name = self.g.unique_name("in");
        let ty = TensorType::new(DType::F32, Shape::batched(dims));
        let op = Op::Input {
            name: name.clone(),
            ty,
        };
        let id = self.g.add_node(&name, op, &[]).expect("input");
        let shape: Vec<usize> = std::iter::once(self.batch)
            .chain(dims.iter().copied())
            .collect();
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| value(&mut self.rng)).collect();
        self.feeds
            .push((id, HostTensor::from_f32(&shape, data).expect("sized")));
        Value::first(id)
    }

    /// A batched input of `dims`, uniform in [-2, 2).
    pub(crate) fn input(&mut self, dims: &[usize]) -> Value {
        self.input_with(dims, |r| r.random_range(-2.0f32..2.0))
    }

    /// A constant of `dims`, uniform in [-1, 1).
    pub(crate) fn constant(&mut self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().product();
        let data = (0..n)
            .map(|_| self.rng.random_range(-1.0f32..1.0))
            .collect();
        let value = HostTensor::from_f32(dims, data).expect("sized");
        self.add("w", Op::Constant { value }, &[])
    }

    /// `op` over `ins` and over their absolute values (S), registered with its depth `k`.
    pub(crate) fn gemm(&mut self, what: &str, op: Op, ins: &[Value], k: usize) {
        let y = self.add(what, op.clone(), ins);
        let abs: Vec<Value> = ins
            .iter()
            .map(|&v| self.add("abs", Op::Unary(UnaryOp::Abs), &[v]))
            .collect();
        let s = self.add(&format!("{what}_abs"), op, &abs);
        self.gemms.push((y, s, k, what.to_string()));
    }

    pub(crate) fn step(&self) -> Step {
        let fetches = self.gemms.iter().flat_map(|&(y, s, ..)| [y, s]).collect();
        Step::new(fetches, Vec::new())
    }
}

pub(crate) fn lowering(precision: Precision) -> LowerOptions {
    LowerOptions {
        precision,
        ..towerpack::backend::cuda::CudaOptions::default().lowering()
    }
}

/// A session on the test device (emulated: reporting `multiprocessors` SMs) in `precision`.
pub(crate) fn device_session(g: &Graph, multiprocessors: u32, precision: Precision) -> CudaSession {
    cuda_common::require_nvrtc();
    let options = CudaOptions {
        cache_dir: None,
        lower: lowering(precision),
        ..CudaOptions::default()
    };
    match cuda_common::test_device() {
        cuda_common::TestDevice::Emulated => {
            let driver = EmulatedDriver::new(1);
            driver
                .device(0)
                .expect("device 0")
                .set_multiprocessors(multiprocessors);
            CudaSession::with_driver(g.clone(), Arc::new(driver), options)
                .expect("emulated session")
        }
        cuda_common::TestDevice::Gpu => cuda_common::session(g.clone(), 1, options),
    }
}

pub(crate) fn cpu_session(g: &Graph, precision: Precision) -> CpuSession {
    CpuSession::new(
        g.clone(),
        CpuOptions {
            threads: 2,
            lower: lowering(precision),
            ..CpuOptions::default()
        },
    )
    .expect("cpu session")
}
