//! Reverse-mode automatic differentiation as a graph pass: gradient nodes added to the same graph.
