//! The tower DSL: symbolic `Tensor` handles with operator overloading, layers called by name
//! (tensorpack's Conv2D, FullyConnected, BatchNorm, ...), argscope defaults, and the `graph!` macro.
