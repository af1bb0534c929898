//! Layouts: how an exported ONNX tensor's axes relate to the IR value it stands for.
//!
//! towerpack is NHWC; ONNX's Conv, ConvTranspose and pooling are NCHW. Rather than wrapping each
//! such op in a Transpose pair, the exporter lets a value *live* in another axis order: a
//! [`Layout`] is a permutation `perm` with `onnx_dim[i] = ir_dim[perm[i]]`. Convolutions and
//! pooling produce [`Layout::nchw`] values; elementwise ops, padding, concatenation, slices,
//! softmax and reductions accept any layout (their axes are remapped) and pass it on; everything
//! else (reshape, matmul, graph outputs, ...) asks for the plain layout. So a chain
//! `conv → batch norm → relu → pool → conv …` is transposed once where it enters and once where
//! it leaves (e.g. before the `Reshape` that flattens it).

use smallvec::SmallVec;

/// An axis order: ONNX axis `i` of the exported tensor is IR axis `perm[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    perm: SmallVec<[usize; 4]>,
}

impl Layout {
    /// The IR's own order for a value of rank `rank`.
    pub fn plain(rank: usize) -> Layout {
        Layout {
            perm: (0..rank).collect(),
        }
    }

    /// NCHW for an NHWC value of rank 4.
    pub fn nchw() -> Layout {
        Layout {
            perm: SmallVec::from_slice(&[0, 3, 1, 2]),
        }
    }

    /// The rank of the values in this layout.
    pub fn rank(&self) -> usize {
        self.perm.len()
    }

    /// True when ONNX and IR axes coincide.
    pub fn is_plain(&self) -> bool {
        self.perm.iter().enumerate().all(|(i, &p)| i == p)
    }

    /// The permutation (`onnx_dim[i] = ir_dim[perm[i]]`).
    pub fn perm(&self) -> &[usize] {
        &self.perm
    }

    /// The ONNX axis holding IR axis `ir_axis`.
    pub fn onnx_axis(&self, ir_axis: usize) -> usize {
        self.perm
            .iter()
            .position(|&p| p == ir_axis)
            .unwrap_or(ir_axis)
    }

    /// A short tag for names of values in this layout (`NCHW`, `perm0312`, ...).
    pub fn tag(&self) -> String {
        if *self == Layout::nchw() {
            "NCHW".to_string()
        } else {
            let digits: String = self.perm.iter().map(|p| p.to_string()).collect();
            format!("perm{digits}")
        }
    }

    /// The `perm` attribute of the ONNX `Transpose` taking a tensor from `self` to `to`
    /// (same rank): output axis `i` is IR axis `to.perm[i]`, found in `self` at its ONNX axis.
    pub fn transpose_to(&self, to: &Layout) -> Vec<i64> {
        to.perm.iter().map(|&a| self.onnx_axis(a) as i64).collect()
    }

    /// The layout after IR axes `removed` are dropped (a reduction without kept dims): the
    /// remaining axes keep their ONNX order and are renumbered.
    pub fn without_axes(&self, removed: &[usize]) -> Layout {
        let perm = self
            .perm
            .iter()
            .filter(|a| !removed.contains(a))
            .map(|&a| a - removed.iter().filter(|&&r| r < a).count())
            .collect();
        Layout { perm }
    }

    /// `dims` (IR order) in this layout's order.
    pub fn apply<T: Copy>(&self, dims: &[T]) -> Vec<T> {
        self.perm.iter().map(|&p| dims[p]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nchw_maps_axes_and_transposes_both_ways() {
        let l = Layout::nchw();
        assert!(!l.is_plain() && Layout::plain(4).is_plain());
        // NHWC channel axis 3 is ONNX axis 1; H (1) is 2.
        assert_eq!(l.onnx_axis(3), 1);
        assert_eq!(l.onnx_axis(1), 2);
        assert_eq!(Layout::plain(4).transpose_to(&l), [0, 3, 1, 2]);
        assert_eq!(l.transpose_to(&Layout::plain(4)), [0, 2, 3, 1]);
        assert_eq!(l.apply(&[8, 32, 30, 16]), [8, 16, 32, 30]);
        // Global average pooling over H and W of an NCHW value leaves [N, C]: plain again.
        assert!(l.without_axes(&[1, 2]).is_plain());
        // Dropping H only leaves IR [N, W, C] held as [N, C, W].
        assert_eq!(l.without_axes(&[1]).perm(), &[0, 2, 1]);
        assert_eq!(l.tag(), "NCHW");
    }
}
