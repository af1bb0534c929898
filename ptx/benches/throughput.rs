//! Emulator throughput in lane-instructions per second on NVRTC kernels: a 256×256×256 SGEMM
//! (64×64 shared-memory tiles) and a float4 elementwise kernel, each on one host thread and on
//! rayon's pool. Run with `cargo bench -p towerpack-ptx`. Figures vary with machine load: compare
//! them only side by side within one run.

use std::time::{Duration, Instant};

use towerpack_ptx::{Device, DevicePtr, KernelArgs, LaunchConfig, LaunchStats, Module};

fn fixture(name: &str) -> Module {
    let path = format!("{}/tests/kernels/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    Module::load(&text).expect("fixture loads")
}

fn upload(dev: &Device, v: &[f32]) -> DevicePtr {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let p = dev.alloc(bytes.len()).expect("alloc");
    dev.copy_htod(p, &bytes).expect("copy");
    p
}

/// Best of `reps` timed launches.
fn time(reps: usize, mut launch: impl FnMut() -> LaunchStats) -> (Duration, LaunchStats) {
    let mut best = Duration::MAX;
    let mut stats = LaunchStats::default();
    for _ in 0..reps {
        let t = Instant::now();
        stats = launch();
        best = best.min(t.elapsed());
    }
    (best, stats)
}

fn report(name: &str, threads: &str, (t, s): (Duration, LaunchStats)) {
    let rate = s.lane_instructions as f64 / t.as_secs_f64();
    println!(
        "{name:<28} {threads:<9} {:>9.2} ms  {:>12} lane-instr  {:>8.1} M lane-instr/s  ({:.1} lanes/warp-instr)",
        t.as_secs_f64() * 1e3,
        s.lane_instructions,
        rate / 1e6,
        s.lane_instructions as f64 / s.warp_instructions as f64
    );
}

fn main() {
    let dev = Device::new(0);
    let sgemm = fixture("sgemm");
    let elementwise = fixture("elementwise");

    let n = 256usize;
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let (pa, pb, pc) = (
        upload(&dev, &a),
        upload(&dev, &a),
        upload(&dev, &vec![0.0; n * n]),
    );
    let gemm_args: Vec<Vec<u8>> = vec![
        pa.0.to_le_bytes().to_vec(),
        pb.0.to_le_bytes().to_vec(),
        pc.0.to_le_bytes().to_vec(),
        (n as i32).to_le_bytes().to_vec(),
        (n as i32).to_le_bytes().to_vec(),
        (n as i32).to_le_bytes().to_vec(),
        1.0f32.to_le_bytes().to_vec(),
        0.0f32.to_le_bytes().to_vec(),
    ];
    let gemm_slices: Vec<&[u8]> = gemm_args.iter().map(Vec::as_slice).collect();
    let gemm_cfg = LaunchConfig {
        grid: [(n / 64) as u32, (n / 64) as u32, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    };

    let m = 1usize << 22;
    let x: Vec<f32> = (0..m).map(|i| (i % 17) as f32 - 8.0).collect();
    let (px, py, po) = (
        upload(&dev, &x),
        upload(&dev, &x),
        upload(&dev, &vec![0.0; m]),
    );
    let ew_args: Vec<Vec<u8>> = vec![
        px.0.to_le_bytes().to_vec(),
        py.0.to_le_bytes().to_vec(),
        po.0.to_le_bytes().to_vec(),
        0.5f32.to_le_bytes().to_vec(),
        (m as i32).to_le_bytes().to_vec(),
    ];
    let ew_slices: Vec<&[u8]> = ew_args.iter().map(Vec::as_slice).collect();
    let ew_cfg = LaunchConfig {
        grid: [(m / 4 / 256) as u32, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    };

    // `cargo bench -p towerpack-ptx -- sgemm` runs only the benchmarks whose name matches.
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    println!(
        "host threads available to rayon: {}",
        rayon::current_num_threads()
    );
    for (parallel, label) in [(false, "1 thread"), (true, "parallel")] {
        dev.set_parallel(parallel);
        if "sgemm".contains(filter.as_str()) {
            let gemm = time(5, || {
                dev.launch(
                    &sgemm,
                    "sgemm_64x64",
                    gemm_cfg,
                    KernelArgs::PerParam(&gemm_slices),
                )
                .expect("sgemm runs")
            });
            report("sgemm 256x256x256", label, gemm);
        }
        if "elementwise".contains(filter.as_str()) {
            let ew = time(5, || {
                dev.launch(
                    &elementwise,
                    "fused_axpy_relu",
                    ew_cfg,
                    KernelArgs::PerParam(&ew_slices),
                )
                .expect("elementwise runs")
            });
            report("axpy_relu float4, 4M elems", label, ew);
        }
    }
}
