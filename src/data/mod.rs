//! Data: the `DataFlow` trait and its combinators, loaders (MNIST IDX, CIFAR-10 binary) and
//! image augmentations. Knows nothing of graphs.
