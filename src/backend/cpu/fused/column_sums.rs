//! Per-column sums of a chunk's rows (an epilogue's per-channel reductions): in `f32`
//! registers over interleaved accumulators, optionally of lane-by-lane products.

/// Adds the column sums of whole rows `lanes` (rows `sums.len()` wide) to `sums`, when the rows
/// are 16, 32 or 64 wide (the channel counts of convolutions); returns whether it did. The
/// columns are summed in `f32` registers (row `r` into accumulator `r mod K`, the `K`
/// accumulators added in order: enough independent additions to hide their latency), so the
/// result depends only on the rows, never on scheduling.
#[inline(always)]
pub(in crate::backend::cpu) fn add_column_sums(
    lanes: &[f32],
    factors: Option<&[f32]>,
    sums: &mut [f64],
) -> bool {
    match sums.len() {
        16 => add_sums(&column_sums::<16, 4>(lanes, factors), sums),
        32 => add_sums(&column_sums::<32, 2>(lanes, factors), sums),
        64 => add_sums(&column_sums::<64, 1>(lanes, factors), sums),
        _ => return false,
    }
    true
}

#[inline(always)]
fn add_sums(part: &[f32], sums: &mut [f64]) {
    sums.iter_mut()
        .zip(part)
        .for_each(|(t, &p)| *t += f64::from(p));
}

/// Per-column sums of the whole `W`-wide rows of `lanes` (a partial last row is ignored; callers
/// pass whole rows), or of the lane-by-lane products `lanes · factors` (each rounded to `f32`
/// before it is added, as a register holding them would be), over `K` interleaved accumulators.
#[inline(always)]
fn column_sums<const W: usize, const K: usize>(lanes: &[f32], factors: Option<&[f32]>) -> [f32; W] {
    let mut acc = [[0.0f32; W]; K];
    match factors {
        None => {
            let mut rest = lanes;
            'rows: loop {
                for a in acc.iter_mut() {
                    let Some((row, tail)) = rest.split_first_chunk::<W>() else {
                        break 'rows;
                    };
                    for c in 0..W {
                        a[c] += row[c];
                    }
                    rest = tail;
                }
            }
        }
        Some(factors) => {
            let (mut rest, mut by) = (lanes, factors);
            'rows: loop {
                for a in acc.iter_mut() {
                    let (Some((row, tail)), Some((f, f_tail))) =
                        (rest.split_first_chunk::<W>(), by.split_first_chunk::<W>())
                    else {
                        break 'rows;
                    };
                    for c in 0..W {
                        a[c] += row[c] * f[c];
                    }
                    (rest, by) = (tail, f_tail);
                }
            }
        }
    }
    let mut total = acc[0];
    for a in &acc[1..] {
        for c in 0..W {
            total[c] += a[c];
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register-accumulated column sums against plain `f64` sums, for every width they take
    /// and row counts that do not divide the accumulators (including none and one).
    #[test]
    fn column_sums_match_plain_sums() {
        let mut seed = 12345u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        };
        for width in [16, 32, 64] {
            for rows in [0, 1, 2, 3, 5, 7, 8, 13, 32] {
                let lanes: Vec<f32> = (0..rows * width).map(|_| next()).collect();
                let mut got = vec![0.5f64; width];
                assert!(add_column_sums(&lanes, None, &mut got));
                for c in 0..width {
                    let want = 0.5
                        + (0..rows)
                            .map(|r| f64::from(lanes[r * width + c]))
                            .sum::<f64>();
                    assert!(
                        (got[c] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "width {width}, {rows} rows, column {c}: {} vs {want}",
                        got[c]
                    );
                }
            }
        }
        for width in [1, 3, 17, 48, 100] {
            assert!(!add_column_sums(&[0.0; 300], None, &mut vec![0.0; width]));
        }
    }
}
