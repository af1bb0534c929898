//! The driver-style device API: allocation, copies, memset, parameter packing against kernel
//! metadata, launch-configuration checks, and the packed-buffer argument form.

mod common;

use common::*;
use towerpack_ptx::{Device, EmuError, KernelArgs, LaunchConfig, create_devices};

#[test]
fn allocations_are_distinct_aligned_zeroed_and_freed() {
    let dev = Device::with_capacity(3, 1 << 20);
    let a = dev.alloc(100).unwrap();
    let b = dev.alloc(100).unwrap();
    assert_ne!(a, b);
    assert_eq!(a.0 % 256, 0);
    assert!(b.0 >= a.0 + 100 + 4096, "guard gap between allocations");
    assert_eq!(download::<u8>(&dev, a, 100), vec![0; 100]);
    assert_eq!(dev.mem_info(), ((1 << 20) - 200, 1 << 20));
    dev.free(a).unwrap();
    assert!(dev.free(a).is_err(), "double free");
    assert!(dev.copy_htod(a, &[1]).is_err(), "use after free");
    assert!(matches!(
        dev.alloc(2 << 20),
        Err(EmuError::OutOfMemory { .. })
    ));
    // Distinct devices hand out disjoint address ranges.
    let devs = create_devices(2);
    let (p0, p1) = (devs[0].alloc(8).unwrap(), devs[1].alloc(8).unwrap());
    assert!(p1.0 - p0.0 >= 1 << 40);
}

#[test]
fn copies_memset_and_interior_pointers() {
    let dev = Device::new(0);
    let data: Vec<u8> = (0..=255).collect();
    let a = upload(&dev, &data);
    let b = dev.alloc(256).unwrap();
    dev.copy_dtod(b.offset(3), a.offset(10), 100).unwrap();
    let got = download::<u8>(&dev, b, 256);
    assert_eq!(&got[3..103], &data[10..110]);
    assert_eq!(got[2], 0);
    dev.memset_d8(b, 0xab, 7).unwrap();
    dev.memset_d32(b.offset(8), 0x1234_5678, 2).unwrap();
    let got = download::<u8>(&dev, b, 16);
    assert_eq!(&got[..8], &[0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 14]);
    assert_eq!(
        &got[8..16],
        &[0x78, 0x56, 0x34, 0x12, 0x78, 0x56, 0x34, 0x12]
    );
    assert!(
        dev.copy_dtod(b.offset(200), a, 100).is_err(),
        "past the end of the destination"
    );
    let mut host = [0u8; 4];
    assert!(
        dev.copy_dtoh(&mut host, a.offset(254)).is_err(),
        "past the end of the source"
    );
}

#[test]
fn parameters_are_checked_against_kernel_metadata() {
    let dev = Device::new(0);
    let m = fixture("grad_avg");
    let k = m.kernel("grad_avg_momentum").unwrap();
    let layout: Vec<(usize, usize, usize)> = k
        .params()
        .iter()
        .map(|p| (p.offset, p.size, p.align))
        .collect();
    assert_eq!(
        layout,
        vec![
            (0, 72, 8),
            (72, 8, 8),
            (80, 8, 8),
            (88, 4, 4),
            (92, 4, 4),
            (96, 4, 4)
        ]
    );
    assert_eq!(k.param_bytes(), 104);
    assert_eq!(k.local_bytes(), 72);
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let err = dev
        .launch(
            &m,
            "grad_avg_momentum",
            cfg,
            KernelArgs::PerParam(&[&[0u8; 72]]),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("1 arguments given, the kernel takes 6"),
        "{err}"
    );
    let eight = 0u64.to_le_bytes();
    let four = 0u32.to_le_bytes();
    let wrong: [&[u8]; 6] = [&[0u8; 72], &eight, &eight, &eight, &four, &four];
    let err = dev
        .launch(&m, "grad_avg_momentum", cfg, KernelArgs::PerParam(&wrong))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("argument 3 (grad_avg_momentum_param_3) has 8 bytes"),
        "{err}"
    );
    assert!(matches!(
        dev.launch(&m, "nope", cfg, KernelArgs::Packed(&[])),
        Err(EmuError::UnknownKernel(_))
    ));
}

#[test]
fn packed_argument_buffer_matches_per_parameter_form() {
    let dev = Device::new(0);
    let m = fixture("elementwise");
    let n = 64usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 20.0).collect();
    let (px, py) = (upload(&dev, &x), upload(&dev, &vec![1.0f32; n]));
    let po = zeros::<f32>(&dev, n);
    let k = m.kernel("fused_axpy_relu").unwrap();
    let mut buf = vec![0u8; k.param_bytes()];
    let put = |buf: &mut Vec<u8>, i: usize, v: &[u8]| {
        let p = &k.params()[i];
        buf[p.offset..p.offset + p.size].copy_from_slice(v);
    };
    put(&mut buf, 0, &px.0.to_le_bytes());
    put(&mut buf, 1, &py.0.to_le_bytes());
    put(&mut buf, 2, &po.0.to_le_bytes());
    put(&mut buf, 3, &2.0f32.to_le_bytes());
    put(&mut buf, 4, &(n as i32).to_le_bytes());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
    };
    let stats = dev
        .launch(&m, "fused_axpy_relu", cfg, KernelArgs::Packed(&buf))
        .unwrap();
    assert!(stats.lane_instructions > 0 && stats.ctas == 1);
    let want: Vec<f32> = x.iter().map(|&v| v.mul_add(2.0, 1.0).max(0.0)).collect();
    assert_bits("packed", &download(&dev, po, n), &want);
}

#[test]
fn launch_configurations_are_validated() {
    let dev = Device::new(0);
    let m = fixture("sgemm");
    let args = Args::default()
        .val(0u64)
        .val(0u64)
        .val(0u64)
        .val(1i32)
        .val(1i32)
        .val(1i32)
        .val(1f32)
        .val(0f32);
    for (grid, block, shared, needle) in [
        ([1, 1, 1], [512, 1, 1], 0, ".maxntid"),
        ([0, 1, 1], [256, 1, 1], 0, "zero dimension"),
        ([1, 1, 1], [2048, 1, 1], 0, "1024 threads"),
        ([1, 70000, 1], [256, 1, 1], 0, "grid"),
        ([1, 1, 1], [256, 1, 1], 300_000, "shared memory"),
    ] {
        let err = args
            .launch(&dev, &m, "sgemm_64x64", grid, block, shared)
            .unwrap_err();
        assert!(
            err.to_string().contains(needle),
            "{grid:?} {block:?}: {err}"
        );
    }
}

#[test]
fn sequential_and_parallel_execution_agree() {
    let dev = Device::new(0);
    let m = fixture("sgemm");
    let mut r = rng(100);
    let (mm, nn, kk) = (96usize, 80usize, 40usize);
    let a = uniform(&mut r, mm * kk, -1.0, 1.0);
    let b = uniform(&mut r, kk * nn, -1.0, 1.0);
    let mut results = Vec::new();
    for parallel in [true, false] {
        dev.set_parallel(parallel);
        let (pa, pb, pc) = (
            upload(&dev, &a),
            upload(&dev, &b),
            zeros::<f32>(&dev, mm * nn),
        );
        Args::default()
            .ptr(pa)
            .ptr(pb)
            .ptr(pc)
            .val(mm as i32)
            .val(nn as i32)
            .val(kk as i32)
            .val(1.0f32)
            .val(0.0f32)
            .launch(&dev, &m, "sgemm_64x64", [2, 2, 1], [256, 1, 1], 0)
            .unwrap();
        results.push(download::<f32>(&dev, pc, mm * nn));
    }
    assert_bits("parallel vs sequential", &results[0], &results[1]);
}
