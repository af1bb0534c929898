//! Access patterns: how a strided view is read along a flattened iteration space.
//!
//! Kernels iterate over the points of their space in row-major order. A view's element index at
//! flat position `f` is classified once per kernel, so loads need no per-element index
//! arithmetic in the common cases: contiguous, broadcast scalar, periodic (a per-channel vector
//! repeating along the flattened space: `index = offset + f % period`), repeated (each element
//! held for `inner` points: `index = offset + f / inner`), and the general odometer.

/// How to find a view's element for each flat position of an iteration space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// `offset + f`.
    Contiguous { offset: usize },
    /// Always `offset`.
    Scalar { offset: usize },
    /// `offset + f % period`.
    Periodic { offset: usize, period: usize },
    /// `offset + f / inner`.
    Repeat { offset: usize, inner: usize },
    /// `offset + Σ index[d]·strides[d]` over `shape`.
    General {
        offset: usize,
        shape: Vec<usize>,
        strides: Vec<usize>,
    },
}

/// Merges adjacent axes that every view (and the contiguous outputs) traverse as one.
/// Returns the coalesced shape and each view's strides over it.
pub fn coalesce(shape: &[usize], views: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); views.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 && shape.len() > 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && views.iter().enumerate().all(|(i, s)| {
                let prev = *out_strides[i].last().unwrap_or(&0);
                prev == s[d] * shape[d]
            });
        if mergeable {
            let last = out_shape.len() - 1;
            out_shape[last] *= shape[d];
            for (i, s) in views.iter().enumerate() {
                *out_strides[i].last_mut().unwrap_or(&mut 0) = s[d];
            }
        } else {
            out_shape.push(shape[d]);
            for (i, s) in views.iter().enumerate() {
                out_strides[i].push(s[d]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for s in &mut out_strides {
            s.push(0);
        }
    }
    (out_shape, out_strides)
}

impl Access {
    /// Classifies a view with `strides` over the (coalesced) iteration `shape`.
    pub fn classify(offset: usize, shape: &[usize], strides: &[usize]) -> Access {
        let rank = shape.len();
        let mut contiguous = vec![0; rank];
        let mut acc = 1;
        for d in (0..rank).rev() {
            contiguous[d] = acc;
            acc *= shape[d];
        }
        let matches = |d: usize, s: usize| shape[d] <= 1 || strides[d] == s;
        if (0..rank).all(|d| matches(d, 0)) {
            return Access::Scalar { offset };
        }
        if (0..rank).all(|d| matches(d, contiguous[d])) {
            return Access::Contiguous { offset };
        }
        // Leading zeros, then a contiguous tail.
        for k in 1..rank {
            let tail: usize = shape[k..].iter().product();
            let lead_zero = (0..k).all(|d| matches(d, 0));
            let tail_contig = (k..rank).all(|d| matches(d, contiguous[d]));
            if lead_zero && tail_contig {
                return Access::Periodic {
                    offset,
                    period: tail,
                };
            }
            // A contiguous head over the leading axes, then zeros.
            let head_contig = (0..k).all(|d| matches(d, contiguous[d] / tail));
            let tail_zero = (k..rank).all(|d| matches(d, 0));
            if head_contig && tail_zero {
                return Access::Repeat {
                    offset,
                    inner: tail,
                };
            }
        }
        Access::General {
            offset,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        }
    }

    /// Writes the element indices of flat positions `start..start + out.len()` into `out`.
    pub fn indices(&self, start: usize, out: &mut [usize]) {
        match self {
            Access::Contiguous { offset } => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = offset + start + i;
                }
            }
            Access::Scalar { offset } => out.fill(*offset),
            Access::Periodic { offset, period } => {
                let mut p = start % period;
                for o in out.iter_mut() {
                    *o = offset + p;
                    p += 1;
                    if p == *period {
                        p = 0;
                    }
                }
            }
            Access::Repeat { offset, inner } => {
                let (mut q, mut r) = (start / inner, start % inner);
                for o in out.iter_mut() {
                    *o = offset + q;
                    r += 1;
                    if r == *inner {
                        r = 0;
                        q += 1;
                    }
                }
            }
            Access::General {
                offset,
                shape,
                strides,
            } => {
                let rank = shape.len();
                let mut idx = vec![0usize; rank];
                let mut rem = start;
                for d in (0..rank).rev() {
                    idx[d] = rem % shape[d];
                    rem /= shape[d];
                }
                let mut pos: usize = offset + (0..rank).map(|d| idx[d] * strides[d]).sum::<usize>();
                for o in out.iter_mut() {
                    *o = pos;
                    for d in (0..rank).rev() {
                        idx[d] += 1;
                        pos += strides[d];
                        if idx[d] < shape[d] {
                            break;
                        }
                        pos -= strides[d] * shape[d];
                        idx[d] = 0;
                    }
                }
            }
        }
    }

    /// Whether this is a [`Access::General`] access whose innermost axis is contiguous (stride
    /// 1, a slice of channels say): one that [`Access::contiguous_runs`] walks.
    pub fn has_contiguous_rows(&self) -> bool {
        self.rows().is_some()
    }

    /// `(offset, shape, strides)` of a [`Access::General`] access whose innermost axis is
    /// contiguous and not empty.
    fn rows(&self) -> Option<(usize, &[usize], &[usize])> {
        match self {
            Access::General {
                offset,
                shape,
                strides,
            } if strides.last() == Some(&1) && shape.last().is_some_and(|&n| n > 0) => {
                Some((*offset, shape, strides))
            }
            _ => None,
        }
    }

    /// For an access that [`Access::has_contiguous_rows`]: calls `run(position, at, len)` for
    /// each run of `len` consecutive elements from `position` that the flat positions
    /// `start..start + n` read, `at` counting from `start` — the indices [`Access::indices`]
    /// gives, a run at a time. Calls nothing for any other access.
    pub fn contiguous_runs(
        &self,
        start: usize,
        n: usize,
        mut run: impl FnMut(usize, usize, usize),
    ) {
        let Some((offset, shape, strides)) = self.rows() else {
            return;
        };
        let inner = shape[shape.len() - 1];
        let mut at = 0;
        while at < n {
            let f = start + at;
            let len = (inner - f % inner).min(n - at);
            let mut rem = f;
            let mut position = offset;
            for (&size, &stride) in shape.iter().zip(strides).rev() {
                position += rem % size * stride;
                rem /= size;
            }
            run(position, at, len);
            at += len;
        }
    }

    /// One past the largest element index this access reads over `points` positions (for bounds
    /// checks before a kernel runs).
    pub fn extent(&self, points: usize) -> usize {
        if points == 0 {
            return 0;
        }
        match self {
            Access::Contiguous { offset } => offset + points,
            Access::Scalar { offset } => offset + 1,
            Access::Periodic { offset, period } => offset + points.min(*period),
            Access::Repeat { offset, inner } => offset + (points - 1) / inner + 1,
            Access::General {
                offset,
                shape,
                strides,
            } => {
                offset
                    + shape
                        .iter()
                        .zip(strides)
                        .map(|(n, s)| (n - 1) * s)
                        .sum::<usize>()
                    + 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(offset: usize, shape: &[usize], strides: &[usize]) -> Vec<usize> {
        let n: usize = shape.iter().product();
        (0..n)
            .map(|f| {
                let mut rem = f;
                let mut pos = offset;
                for d in (0..shape.len()).rev() {
                    pos += (rem % shape[d]) * strides[d];
                    rem /= shape[d];
                }
                pos
            })
            .collect()
    }

    #[test]
    fn every_pattern_matches_the_odometer_from_any_start() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[4, 3, 5], &[15, 5, 1]),
            (&[4, 3, 5], &[0, 0, 0]),
            (&[4, 3, 5], &[0, 0, 1]),
            (&[4, 3, 5], &[0, 5, 1]),
            (&[4, 3, 5], &[3, 1, 0]),
            (&[4, 3, 5], &[1, 0, 0]),
            (&[4, 3, 5], &[1, 20, 4]),
            (&[4, 3, 5], &[0, 1, 0]),
        ];
        for &(shape, strides) in cases {
            let a = Access::classify(7, shape, strides);
            let expected = brute(7, shape, strides);
            for start in [0, 1, 4, 13, 59] {
                let mut got = vec![0; expected.len() - start];
                a.indices(start, &mut got);
                assert_eq!(got, expected[start..], "{a:?} from {start}");
            }
            assert_eq!(
                a.extent(expected.len()),
                expected.iter().max().map_or(0, |m| m + 1),
                "{a:?}"
            );
        }
        assert!(matches!(
            Access::classify(0, &[4, 3, 5], &[0, 0, 1]),
            Access::Periodic { period: 5, .. }
        ));
        assert!(matches!(
            Access::classify(0, &[4, 3, 5], &[3, 1, 0]),
            Access::Repeat { inner: 5, .. }
        ));
    }

    /// Runs of a view with contiguous rows, concatenated, are the odometer's indices from any
    /// start and for any length; other patterns have no runs.
    #[test]
    fn contiguous_runs_are_the_odometer_a_row_at_a_time() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[4, 3, 5], &[40, 12, 1]),
            (&[6, 16], &[64, 1]),
            (&[2, 3, 1], &[7, 2, 1]),
        ];
        for &(shape, strides) in cases {
            let a = Access::General {
                offset: 3,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            };
            assert!(a.has_contiguous_rows(), "{a:?}");
            let expected = brute(3, shape, strides);
            let starts = [0, 1, 4, 13, expected.len() - 1];
            for start in starts.into_iter().filter(|&s| s < expected.len()) {
                let rest = expected.len() - start;
                for n in [0, 1, 7, rest].into_iter().filter(|&n| n <= rest) {
                    let mut got = Vec::new();
                    a.contiguous_runs(start, n, |position, at, len| {
                        assert_eq!(at, got.len(), "{a:?} from {start}");
                        got.extend(position..position + len);
                    });
                    assert_eq!(got, expected[start..start + n], "{a:?} from {start}, {n}");
                }
            }
        }
        let strided = Access::General {
            offset: 0,
            shape: vec![4, 5],
            strides: vec![10, 2],
        };
        assert!(!strided.has_contiguous_rows());
        assert!(!Access::Contiguous { offset: 0 }.has_contiguous_rows());
    }

    #[test]
    fn coalescing_merges_axes_every_view_walks_together() {
        // x [2,3,4,8] contiguous and a per-channel [8] vector: the first three axes merge.
        let (shape, strides) = coalesce(&[2, 3, 4, 8], &[&[96, 32, 8, 1], &[0, 0, 0, 1]]);
        assert_eq!(shape, vec![24, 8]);
        assert_eq!(strides, vec![vec![8, 1], vec![0, 1]]);
        let (shape, _) = coalesce(&[2, 3], &[&[3, 1]]);
        assert_eq!(shape, vec![6]);
    }
}
