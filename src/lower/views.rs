//! Strided views: how layout ops (reshape, transpose, slice, broadcast) become index maps over an
//! existing buffer instead of copies.

use smallvec::SmallVec;

/// A strided view of a materialised tensor: element `offset + Σ index[d]·strides[d]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ViewMap {
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: SmallVec<[usize; 4]>,
}

impl ViewMap {
    /// The identity view of a contiguous tensor.
    pub fn identity(shape: &[usize]) -> ViewMap {
        ViewMap {
            offset: 0,
            shape: shape.to_vec(),
            strides: super::program::contiguous_strides(shape),
        }
    }

    /// True when the view walks its elements contiguously (from any offset).
    pub fn is_dense(&self) -> bool {
        self.strides
            .iter()
            .zip(super::program::contiguous_strides(&self.shape).iter())
            .zip(&self.shape)
            .all(|((a, b), &n)| n <= 1 || a == b)
    }

    /// True when this is the identity view of a contiguous tensor of its shape.
    pub fn is_identity(&self) -> bool {
        self.offset == 0
            && self
                .strides
                .iter()
                .zip(super::program::contiguous_strides(&self.shape).iter())
                .zip(&self.shape)
                .all(|((a, b), &n)| n <= 1 || a == b)
    }

    /// The same elements viewed with a new shape, when strides allow it without a copy: the
    /// view is contiguous, or the reshape only merges and splits axes whose strides nest
    /// (which covers adding and removing axes of size 1, e.g. of a broadcast view).
    pub fn reshape(&self, shape: &[usize]) -> Option<ViewMap> {
        let contiguous = self
            .strides
            .iter()
            .zip(super::program::contiguous_strides(&self.shape).iter())
            .zip(&self.shape)
            .all(|((a, b), &n)| n <= 1 || a == b);
        if contiguous {
            return Some(ViewMap {
                offset: self.offset,
                ..ViewMap::identity(shape)
            });
        }
        // Group the old and new axes (ignoring size-1 axes) into runs of equal element count;
        // each old run must be traversable with one stride pattern.
        let old: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(n, _)| **n != 1)
            .map(|(n, s)| (*n, *s))
            .collect();
        let mut strides = vec![0usize; shape.len()];
        let (mut i, mut j) = (0usize, 0usize);
        while j < shape.len() {
            if shape[j] == 1 {
                j += 1;
                continue;
            }
            // Take old axes until their product covers the new run.
            let (mut old_count, mut new_count) = (1usize, 1usize);
            let (i0, j0) = (i, j);
            loop {
                if old_count == new_count && old_count > 1 {
                    break;
                }
                if old_count <= new_count {
                    let (n, _) = *old.get(i)?;
                    old_count *= n;
                    i += 1;
                } else {
                    while j < shape.len() && shape[j] == 1 {
                        j += 1;
                    }
                    new_count *= *shape.get(j)?;
                    j += 1;
                }
                if old_count == new_count && j > j0 && i > i0 {
                    break;
                }
            }
            // The old run must nest: stride[k] = stride[k+1] * n[k+1].
            let run = &old[i0..i];
            if run.windows(2).any(|w| w[0].1 != w[1].1 * w[1].0) {
                return None;
            }
            let mut stride = run.last().map_or(0, |r| r.1);
            for d in (j0..j).rev() {
                if shape[d] != 1 {
                    strides[d] = stride;
                    stride *= shape[d];
                }
            }
        }
        if i != old.len() {
            return None;
        }
        Some(ViewMap {
            offset: self.offset,
            shape: shape.to_vec(),
            strides: strides.into(),
        })
    }

    /// Axes permuted: axis `i` of the result is axis `perm[i]` of `self`.
    pub fn transpose(&self, perm: &[usize]) -> ViewMap {
        ViewMap {
            offset: self.offset,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    /// Elements `start..end` of `axis`.
    pub fn slice(&self, axis: usize, start: usize, end: usize) -> ViewMap {
        let mut v = self.clone();
        v.offset += start * self.strides[axis];
        v.shape[axis] = end - start;
        v
    }

    /// NumPy broadcast to `target` (the caller checked compatibility).
    pub fn broadcast_to(&self, target: &[usize]) -> ViewMap {
        let lead = target.len() - self.shape.len();
        let strides = (0..target.len())
            .map(|d| {
                if d < lead || self.shape[d - lead] != target[d] {
                    0
                } else {
                    self.strides[d - lead]
                }
            })
            .collect();
        ViewMap {
            offset: self.offset,
            shape: target.to_vec(),
            strides,
        }
    }

    /// Appends trailing axes of the given sizes with stride 0 (used by one-hot encoding).
    pub fn with_trailing_broadcast(&self, extra: &[usize]) -> ViewMap {
        let mut v = self.clone();
        v.shape.extend_from_slice(extra);
        v.strides.extend(extra.iter().map(|_| 0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_ops_compose_as_index_maps() {
        let v = ViewMap::identity(&[2, 3, 4]);
        let t = v.transpose(&[2, 0, 1]);
        assert_eq!(t.shape, vec![4, 2, 3]);
        assert_eq!(t.strides.as_slice(), &[1, 12, 4]);
        assert!(
            t.reshape(&[24]).is_none(),
            "a transposed view is not contiguous"
        );
        let s = v.slice(2, 1, 3);
        assert_eq!((s.offset, s.shape.clone()), (1, vec![2, 3, 2]));
        let b = ViewMap::identity(&[4]).broadcast_to(&[2, 3, 4]);
        assert_eq!(b.strides.as_slice(), &[0, 0, 1]);
        assert!(v.reshape(&[6, 4]).expect("contiguous").is_identity());
        // A broadcast view gains a size-1 axis without a copy; a transposed one can split.
        let b = ViewMap::identity(&[]).broadcast_to(&[8]);
        let r = b.reshape(&[8, 1]).expect("unsqueeze of a broadcast");
        assert_eq!(
            (r.shape.clone(), r.strides.to_vec()),
            (vec![8, 1], vec![0, 0])
        );
        let tr = ViewMap::identity(&[4, 6]).transpose(&[1, 0]);
        let split = tr.reshape(&[2, 3, 4]).expect("split a strided axis");
        assert_eq!(split.strides.to_vec(), vec![3, 1, 6]);
        assert!(tr.reshape(&[24]).is_none());
        let one_hot = ViewMap::identity(&[5]).with_trailing_broadcast(&[10]);
        assert_eq!(one_hot.strides.as_slice(), &[1, 0]);
    }
}
