//! Several emulated devices: the fused gradient average + momentum kernel (tower pointers passed
//! in a struct by value, copied to local memory by NVRTC) after peer copies of each tower's
//! gradients to device 0, and detection of a pointer used on the wrong device.

mod common;

use common::*;
use towerpack_ptx::{EmuError, Fault, copy_peer, create_devices};

#[test]
fn gradient_average_over_towers_on_two_devices() {
    let devs = create_devices(2);
    let m = fixture("grad_avg");
    let mut r = rng(60);
    let n = 1000usize;
    let towers = 3usize;
    let grads: Vec<Vec<f32>> = (0..towers).map(|_| uniform(&mut r, n, -1.0, 1.0)).collect();
    let w0 = uniform(&mut r, n, -1.0, 1.0);
    let v0 = uniform(&mut r, n, -0.1, 0.1);
    let (lr, mu) = (0.1f32, 0.9f32);
    // Tower t's gradient lives on device t % 2; gather them on device 0 with peer copies.
    let mut local = Vec::new();
    for (t, g) in grads.iter().enumerate() {
        let owner = &devs[t % 2];
        let src = upload(owner, g);
        let dst = devs[0].alloc(n * 4).unwrap();
        copy_peer(&devs[0], dst, owner, src, n * 4).unwrap();
        local.push(dst);
    }
    let (pw, pv) = (upload(&devs[0], &w0), upload(&devs[0], &v0));
    let mut towers_struct = Vec::new();
    for t in 0..8 {
        let p = local.get(t).map_or(0u64, |p| p.0);
        towers_struct.extend_from_slice(&p.to_le_bytes());
    }
    towers_struct.extend_from_slice(&(towers as i32).to_le_bytes());
    towers_struct.extend_from_slice(&[0u8; 4]);
    Args::default()
        .raw(towers_struct)
        .ptr(pw)
        .ptr(pv)
        .val(lr)
        .val(mu)
        .val(n as i32)
        .launch(
            &devs[0],
            &m,
            "grad_avg_momentum",
            [(n as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            0,
        )
        .unwrap();
    let (w, v) = (
        download::<f32>(&devs[0], pw, n),
        download::<f32>(&devs[0], pv, n),
    );
    let mut want_w = vec![0f64; n];
    let mut want_v = vec![0f64; n];
    for i in 0..n {
        let g: f64 = grads.iter().map(|g| f64::from(g[i])).sum::<f64>() / towers as f64;
        want_v[i] = f64::from(mu) * f64::from(v0[i]) + g;
        want_w[i] = f64::from(w0[i]) - f64::from(lr) * want_v[i];
    }
    assert_close("velocity", &v, &want_v, 1e-6, 1e-6);
    assert_close("weights", &w, &want_w, 1e-6, 1e-6);
}

#[test]
fn a_pointer_of_another_device_is_an_error_naming_both() {
    let devs = create_devices(2);
    let m = fixture("elementwise");
    let on_dev1 = upload(&devs[1], &[1.0f32; 8]);
    let out = zeros::<f32>(&devs[0], 8);
    let err = Args::default()
        .ptr(on_dev1)
        .ptr(on_dev1)
        .ptr(out)
        .val(1.0f32)
        .val(8i32)
        .launch(&devs[0], &m, "fused_axpy_relu", [1, 1, 1], [32, 1, 1], 0)
        .unwrap_err();
    let EmuError::Exec(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.kernel, "fused_axpy_relu");
    assert!(
        matches!(
            e.fault,
            Fault::WrongDevice {
                owner: 1,
                device: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(e.text.starts_with("ld.global"), "{err}");
    // And host-side copies refuse it too.
    let mut buf = [0u8; 4];
    let err = devs[0].copy_dtoh(&mut buf, on_dev1).unwrap_err();
    assert!(err.to_string().contains("belongs to device 1"), "{err}");
}
