//! Address spaces and their faults, with hand-written PTX: generic addressing of shared and
//! local memory through `cvta`, parameter reads through a register, misaligned accesses, shared
//! memory out of bounds, dynamic shared memory sized at launch.

mod common;

use common::*;
use towerpack_ptx::{Device, EmuError, Fault, Module, Space};

const KERNELS: &str = r#"
.version 8.8
.target sm_80
.address_size 64
.extern .shared .align 16 .b8 dyn[];

.visible .entry generic(.param .u64 out, .param .u32 bias)
{
    .local .align 4 .b8 depot[128];
    .shared .align 4 .b8 tile[128];
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    mov.u64 %rd3, tile;
    cvta.shared.u64 %rd4, %rd3;
    add.s64 %rd5, %rd4, %rd2;
    st.u32 [%rd5], %r1;
    mov.u64 %rd6, depot;
    cvta.local.u64 %rd7, %rd6;
    add.s64 %rd8, %rd7, %rd2;
    add.s32 %r2, %r1, 1000;
    st.u32 [%rd8], %r2;
    bar.sync 0;
    xor.b32 %r3, %r1, 1;
    mul.wide.u32 %rd9, %r3, 4;
    add.s64 %rd10, %rd4, %rd9;
    ld.u32 %r4, [%rd10];
    ld.u32 %r5, [%rd8];
    mov.u64 %rd11, bias;
    ld.param.u32 %r6, [%rd11];
    add.s32 %r7, %r4, %r5;
    add.s32 %r7, %r7, %r6;
    add.s64 %rd11, %rd1, %rd2;
    st.global.u32 [%rd11], %r7;
    ret;
}

.visible .entry misaligned(.param .u64 p)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    add.s64 %rd2, %rd1, 2;
    ld.global.u32 %r1, [%rd2];
    ret;
}

.visible .entry shared_oob()
{
    .shared .align 4 .b8 small[64];
    .reg .b32 %r<5>;
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, small;
    add.s32 %r4, %r3, %r2;
    st.shared.u32 [%r4], %r1;
    ret;
}

.visible .entry dynamic(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    mov.u64 %rd3, dyn;
    add.s64 %rd4, %rd3, %rd2;
    st.shared.u32 [%rd4], %r1;
    bar.sync 0;
    ld.shared.u32 %r2, [dyn+4];
    add.s64 %rd4, %rd1, %rd2;
    st.global.u32 [%rd4], %r2;
    ret;
}
"#;

fn module() -> Module {
    Module::load(KERNELS).unwrap()
}

fn fault(err: EmuError) -> Fault {
    match err {
        EmuError::Exec(e) => e.fault,
        other => panic!("{other}"),
    }
}

#[test]
fn generic_addresses_reach_shared_local_and_param() {
    let dev = Device::new(0);
    let out = zeros::<u32>(&dev, 32);
    Args::default()
        .ptr(out)
        .val(7u32)
        .launch(&dev, &module(), "generic", [1, 1, 1], [32, 1, 1], 0)
        .unwrap();
    let want: Vec<u32> = (0..32).map(|t| (t ^ 1) + t + 1000 + 7).collect();
    assert_eq!(download::<u32>(&dev, out, 32), want);
}

#[test]
fn misaligned_global_access_is_reported() {
    let dev = Device::new(0);
    let buf = zeros::<u32>(&dev, 8);
    let f = fault(
        Args::default()
            .ptr(buf)
            .launch(&dev, &module(), "misaligned", [1, 1, 1], [1, 1, 1], 0)
            .unwrap_err(),
    );
    assert_eq!(
        f,
        Fault::Misaligned {
            space: Space::Global,
            addr: buf.0 + 2,
            bytes: 4
        }
    );
}

#[test]
fn shared_memory_out_of_bounds_is_reported_for_the_first_bad_lane() {
    let dev = Device::new(0);
    let err = Args::default()
        .launch(&dev, &module(), "shared_oob", [1, 1, 1], [32, 1, 1], 0)
        .unwrap_err();
    let EmuError::Exec(e) = err else { panic!() };
    assert_eq!(
        e.thread,
        Some([16, 0, 0]),
        "lane 16 writes bytes 64..68 of a 64-byte array"
    );
    assert!(
        matches!(
            e.fault,
            Fault::OutOfBounds {
                space: Space::Shared,
                bytes: 4,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn dynamic_shared_memory_is_sized_at_launch() {
    let dev = Device::new(0);
    let m = module();
    assert!(m.kernel("dynamic").unwrap().uses_dynamic_shared());
    let out = zeros::<u32>(&dev, 32);
    Args::default()
        .ptr(out)
        .launch(&dev, &m, "dynamic", [1, 1, 1], [32, 1, 1], 128)
        .unwrap();
    assert_eq!(download::<u32>(&dev, out, 32), vec![1; 32]);
    // Too little dynamic shared memory for 32 threads: lane 16 is the first out of bounds.
    let err = Args::default()
        .ptr(out)
        .launch(&dev, &m, "dynamic", [1, 1, 1], [32, 1, 1], 64)
        .unwrap_err();
    assert!(matches!(
        fault(err),
        Fault::OutOfBounds {
            space: Space::Shared,
            ..
        }
    ));
}
