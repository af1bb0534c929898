//! Per-launch counters (global memory instructions, bytes, sectors, load epochs, shared
//! wavefronts, the busiest CTA) and sampled launches that run only some CTAs.

use towerpack_ptx::{Device, DevicePtr, KernelArgs, LaunchConfig};

/// `y[i] = 2 * x[i]` with `i = ctaid.x * ntid.x + tid.x`, and each thread's value bounced
/// through shared memory at word `tid * stride` (stride 1: no bank conflict; 32: every lane in
/// bank 0).
const PTX: &str = r#"
.version 8.8
.target sm_80
.address_size 64
.visible .entry k(.param .u64 x, .param .u64 y, .param .u32 stride)
{
    .reg .b32 %r<8>; .reg .f32 %f<3>; .reg .b64 %rd<8>;
    .shared .align 4 .b8 s[4096];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u32 %r5, [stride];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd3, %r4, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.f32 %f1, [%rd4];
    mul.lo.s32 %r6, %r1, %r5;
    mul.wide.u32 %rd5, %r6, 4;
    mov.u64 %rd6, s;
    add.s64 %rd7, %rd6, %rd5;
    st.shared.f32 [%rd7], %f1;
    ld.shared.f32 %f1, [%rd7];
    add.f32 %f2, %f1, %f1;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f2;
    ret;
}"#;

fn run(stride: u32, ctas: Option<&[u64]>) -> (towerpack_ptx::LaunchStats, Vec<f32>) {
    let dev = Device::new(0);
    let m = dev.load_module(PTX).expect("load");
    let n = 4 * 32;
    let host: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let x = dev.alloc(n * 4).expect("x");
    let y = dev.alloc(n * 4).expect("y");
    dev.copy_htod(x, &host).expect("copy");
    let args: [&[u8]; 3] = [
        &x.0.to_le_bytes(),
        &y.0.to_le_bytes(),
        &stride.to_le_bytes(),
    ];
    let cfg = LaunchConfig {
        grid: [4, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let stats = match ctas {
        None => dev.launch(&m, "k", cfg, KernelArgs::PerParam(&args)),
        Some(c) => dev.launch_sampled(&m, "k", cfg, KernelArgs::PerParam(&args), c),
    }
    .expect("launch");
    let mut out = vec![0u8; n * 4];
    dev.copy_dtoh(&mut out, DevicePtr(y.0)).expect("copy back");
    let values = out
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (stats, values)
}

#[test]
fn a_launch_counts_its_global_and_shared_memory_traffic() {
    let (s, y) = run(1, None);
    assert_eq!(y[77], 154.0);
    assert_eq!(s.ctas, 4);
    // One warp per CTA: one global load and one global store each.
    assert_eq!((s.global_loads, s.global_stores), (4, 4));
    assert_eq!(s.global_bytes, 4 * 2 * 32 * 4);
    // 128 contiguous bytes are 4 sectors, per access.
    assert_eq!(s.global_sectors, 4 * 2 * 4);
    assert_eq!(s.load_epochs, 4);
    // A store and a load to distinct banks: one wavefront each.
    assert_eq!(s.shared_wavefronts, 4 * 2);
    assert_eq!(s.max_cta_warp_instructions * 4, s.warp_instructions);
    // Every lane in bank 0: 32 wavefronts per access.
    let (conflicted, _) = run(32, None);
    assert_eq!(conflicted.shared_wavefronts, 4 * 2 * 32);
}

#[test]
fn a_sampled_launch_runs_only_the_given_ctas() {
    let (full, _) = run(1, None);
    let (s, y) = run(1, Some(&[1, 3, 99]));
    assert_eq!(s.ctas, 2, "the CTA beyond the grid is skipped");
    assert_eq!(s.warp_instructions * 2, full.warp_instructions);
    assert_eq!(y[33], 66.0, "CTA 1 ran");
    assert_eq!(y[5], 0.0, "CTA 0 did not");
}
