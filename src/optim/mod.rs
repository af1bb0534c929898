//! Optimizers (SGD, Momentum, Adam) and gradient processors, built as graph ops.
