//! Symbolic shapes and tensor types of the op graph.
//!
//! A dimension is either a fixed size or the symbolic batch size `N`, which may only stand in the
//! leading position. Broadcasting follows NumPy: shapes align on the right, and a dimension of 1
//! stretches to match.

use crate::tensor::DType;
use smallvec::SmallVec;
use std::fmt;

/// One dimension of a symbolic shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// The symbolic batch size, bound when a step is compiled or run. Printed as `N`.
    Batch,
    /// A size known when the graph is built.
    Fixed(usize),
}

impl Dim {
    /// The size, if fixed.
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Batch => None,
        }
    }

    /// The concrete size once the batch size is known.
    pub fn resolve(self, batch: usize) -> usize {
        match self {
            Dim::Fixed(n) => n,
            Dim::Batch => batch,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Batch => f.write_str("N"),
            Dim::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

/// A symbolic shape: a list of dimensions, `N` allowed only first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Shape(pub SmallVec<[Dim; 4]>);

impl Shape {
    /// A shape of fixed dimensions.
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    /// `[N, dims...]`: a batch of items of shape `dims`.
    pub fn batched(dims: &[usize]) -> Shape {
        let mut v: SmallVec<[Dim; 4]> = SmallVec::with_capacity(dims.len() + 1);
        v.push(Dim::Batch);
        v.extend(dims.iter().map(|&d| Dim::Fixed(d)));
        Shape(v)
    }

    /// The rank-0 shape.
    pub fn scalar() -> Shape {
        Shape(SmallVec::new())
    }

    /// Builds a shape from dimensions.
    pub fn from_dims(dims: impl IntoIterator<Item = Dim>) -> Shape {
        Shape(dims.into_iter().collect())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// Dimension `i`.
    pub fn dim(&self, i: usize) -> Dim {
        self.0[i]
    }

    /// True when the leading dimension is the symbolic batch.
    pub fn has_batch(&self) -> bool {
        self.0.first() == Some(&Dim::Batch)
    }

    /// True when every dimension is fixed.
    pub fn is_static(&self) -> bool {
        self.0.iter().all(|d| matches!(d, Dim::Fixed(_)))
    }

    /// The concrete dimensions, if all are fixed.
    pub fn to_static(&self) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.fixed()).collect()
    }

    /// The concrete dimensions once the batch size is known.
    pub fn resolve(&self, batch: usize) -> Vec<usize> {
        self.0.iter().map(|d| d.resolve(batch)).collect()
    }

    /// Product of the fixed dimensions (the element count per batch item when batched).
    pub fn fixed_product(&self) -> usize {
        self.0.iter().filter_map(|d| d.fixed()).product()
    }

    /// The number of elements, if static.
    pub fn num_elements(&self) -> Option<usize> {
        self.to_static().map(|d| d.iter().product())
    }

    /// True when `N` appears anywhere but first (such a shape is invalid).
    pub fn batch_misplaced(&self) -> bool {
        self.0.iter().skip(1).any(|d| *d == Dim::Batch)
    }

    /// NumPy broadcasting of two shapes; `None` when they are incompatible.
    ///
    /// `N` against `1` gives `N`; `N` against a fixed size other than 1 is incompatible, because
    /// the batch size is not known to match.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out: SmallVec<[Dim; 4]> = SmallVec::with_capacity(rank);
        for i in 0..rank {
            let da = (i + a.rank()).checked_sub(rank).map(|j| a.0[j]);
            let db = (i + b.rank()).checked_sub(rank).map(|j| b.0[j]);
            let d = match (da, db) {
                (None, Some(d)) | (Some(d), None) => d,
                (Some(x), Some(y)) if x == y => x,
                (Some(Dim::Fixed(1)), Some(d)) | (Some(d), Some(Dim::Fixed(1))) => d,
                _ => return None,
            };
            out.push(d);
        }
        let s = Shape(out);
        if s.batch_misplaced() { None } else { Some(s) }
    }

    /// True when `self` broadcasts to `target` (without changing `target`).
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        self.rank() <= target.rank() && Shape::broadcast(self, target).as_ref() == Some(target)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value in the graph: element type and symbolic shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype, shape }
    }

    /// The (static) type of a host tensor: how errors print a value next to the type it should
    /// have had (`f32[2,3]`).
    pub fn of_host(t: &crate::tensor::HostTensor) -> TensorType {
        TensorType::new(t.dtype(), Shape::fixed(t.shape()))
    }

    /// An `f32` tensor type of the given shape.
    pub fn f32(shape: Shape) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    /// A rank-0 type.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, Shape::scalar())
    }

    /// Rank of the shape.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy_with_a_symbolic_batch() {
        let x = Shape::batched(&[32, 32, 16]);
        let c = Shape::fixed(&[16]);
        assert_eq!(Shape::broadcast(&x, &c), Some(x.clone()));
        assert_eq!(
            Shape::broadcast(&Shape::fixed(&[1, 3]), &Shape::fixed(&[2, 1])),
            Some(Shape::fixed(&[2, 3]))
        );
        assert_eq!(Shape::broadcast(&x, &Shape::fixed(&[4, 1, 1, 1])), None);
        assert_eq!(
            Shape::broadcast(&x, &Shape::fixed(&[1, 1, 1, 1])),
            Some(x.clone())
        );
        assert_eq!(
            Shape::broadcast(&Shape::fixed(&[3]), &Shape::fixed(&[4])),
            None
        );
        assert!(c.broadcasts_to(&x));
        assert!(!x.broadcasts_to(&c));
    }

    #[test]
    fn display_uses_n_for_the_batch() {
        assert_eq!(
            TensorType::f32(Shape::batched(&[10])).to_string(),
            "f32[N,10]"
        );
        assert_eq!(TensorType::scalar(DType::I64).to_string(), "i64[]");
    }
}
