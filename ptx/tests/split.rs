//! Cross-CTA cooperation through global memory: `membar.gl` is a real memory fence, so the
//! last-block-combines pattern of split reductions (partials stored, fence, atomic count, the
//! last CTA fences and adds the partials in CTA order) gives the sequential result bit for bit
//! while CTAs run on several host threads; and 128-bit vector loads and stores (`ld.global.nc.v4`,
//! `st.shared.v4`, `ld.shared.v4`, `st.global.v4`) move the four lanes of each vector unchanged.

mod common;

use common::*;
use towerpack_ptx::Device;

/// The kernel's arithmetic replayed in Rust: per CTA, 256 lane-strided f32 sums, then the
/// shared-memory tree (s = 128, 64, ..., 1), then the partials added in CTA order.
fn split_sum_reference(x: &[f32], chunk: usize, blocks: usize) -> f32 {
    let mut total = 0.0f32;
    for b in 0..blocks {
        let (begin, end) = (b * chunk, ((b + 1) * chunk).min(x.len()));
        let mut part = [0.0f32; 256];
        for (t, p) in part.iter_mut().enumerate() {
            let mut i = begin + t;
            while i < end {
                *p += x[i];
                i += 256;
            }
        }
        let mut s = 128;
        while s > 0 {
            for t in 0..s {
                part[t] += part[t + s];
            }
            s /= 2;
        }
        total += part[0];
    }
    total
}

#[test]
fn the_last_cta_combines_every_partial_in_a_fixed_order() {
    let dev = Device::new(0);
    dev.set_parallel(true);
    let m = fixture("split");
    let mut r = rng(31);
    // Lengths that are not multiples of the chunk, a single CTA, and many CTAs.
    for (n, chunk) in [(100_000usize, 1536usize), (777, 1000), (40_000, 300)] {
        let blocks = n.div_ceil(chunk);
        let x = uniform(&mut r, n, -1.0, 1.0);
        let px = upload(&dev, &x);
        let partials = zeros::<f32>(&dev, blocks);
        let counter = zeros::<u32>(&dev, 1);
        let out = zeros::<f32>(&dev, 1);
        let want = split_sum_reference(&x, chunk, blocks);
        // Repeated launches reuse the counter: the last CTA resets it.
        for run in 0..4 {
            Args::default()
                .ptr(px)
                .val(n as i32)
                .val(chunk as i32)
                .ptr(partials)
                .ptr(counter)
                .ptr(out)
                .launch(&dev, &m, "split_sum", [blocks as u32, 1, 1], [256, 1, 1], 0)
                .unwrap();
            assert_bits(
                &format!("n={n} run {run}"),
                &download(&dev, out, 1),
                &[want],
            );
            assert_eq!(download::<u32>(&dev, counter, 1), vec![0], "counter reset");
        }
    }
}

#[test]
fn vector_loads_and_stores_move_four_lanes() {
    let dev = Device::new(0);
    let m = fixture("split");
    let mut r = rng(32);
    let n4 = 1000usize;
    let x = uniform(&mut r, 4 * n4, -10.0, 10.0);
    let (px, py) = (upload(&dev, &x), zeros::<f32>(&dev, 4 * n4));
    Args::default()
        .ptr(px)
        .ptr(py)
        .val(n4 as i32)
        .val(0.5f32)
        .launch(&dev, &m, "vec4_rotate", [4, 1, 1], [256, 1, 1], 0)
        .unwrap();
    // Every element is scaled in place: the rotation through shared memory only changes which
    // thread stores it.
    let want: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
    assert_bits("vec4_rotate", &download(&dev, py, 4 * n4), &want);
}
