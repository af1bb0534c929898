//! Data: the `DataFlow` trait and its combinators, loaders (MNIST IDX, CIFAR-10 binary, the
//! embedded `mnist10k`) and image augmentations. Knows nothing of graphs: it depends only on
//! [`crate::tensor`].
//!
//! Determinism is the design rule: every shuffle and augmentation draws from
//! [`RandomKey`]`(seed, pass, index)`, so a flow's position is a small [`FlowState`] and a run
//! restored mid-pass — even through [`PrefetchData`] with several workers — continues with exactly
//! the datapoints the uninterrupted run would have produced.
//!
//! ```
//! use std::sync::Arc;
//! use towerpack::data::*;
//!
//! // The first 8,000 embedded digits, reshuffled every pass, padded and flipped, in batches.
//! let train = mnist10k_split()?.train.slice(0, 100)?;
//! let source = train.to_flow(Some(42))?;
//! let augmentors: Vec<Arc<dyn ImageAugmentor>> =
//!     vec![Arc::new(CenterPaste::new(32, 32)), Arc::new(Flip::horizontal())];
//! let augmented = AugmentImageComponent::new(source, 0, augmentors, 7);
//! let batches = BatchData::new(augmented, 16, false)?;
//! let mut flow = PrefetchData::new(batches, 2, 4)?;
//! flow.reset_state()?;
//! let first = flow.next_datapoint()?.expect("a batch");
//! assert_eq!(first[0].shape(), &[16, 32, 32, 1]);
//! assert_eq!(first[1].shape(), &[16]);
//!
//! // Save the position (e.g. in a checkpoint), rebuild the pipeline, continue exactly.
//! let saved = flow.state().to_json();
//! let expected = flow.next_datapoint()?;
//! # let source = train.to_flow(Some(42))?;
//! # let augmentors: Vec<Arc<dyn ImageAugmentor>> =
//! #     vec![Arc::new(CenterPaste::new(32, 32)), Arc::new(Flip::horizontal())];
//! # let augmented = AugmentImageComponent::new(source, 0, augmentors, 7);
//! # let mut resumed = PrefetchData::new(BatchData::new(augmented, 16, false)?, 1, 4)?;
//! resumed.reset_state()?;
//! resumed.restore(&FlowState::from_json(&saved)?)?;
//! assert_eq!(resumed.next_datapoint()?, expected);
//! # Ok::<(), DataError>(())
//! ```

mod augment;
mod batch;
mod cast;
mod cifar;
mod error;
mod flow;
mod idx;
mod images;
mod map;
mod mnist;
mod prefetch;
mod repeat;
mod rng;
mod shuffle;
mod source;
mod speed;

pub use augment::{
    AugmentImageComponent, CenterPaste, Flip, ImageAugmentor, Normalize, RandomCrop,
};
pub use batch::{BatchData, stack_datapoints};
pub use cast::CastData;
pub use cifar::{
    CIFAR_CLASSES, CIFAR_RECORD, CIFAR_SIDE, CifarSplit, load_cifar10, read_cifar10_batch,
};
pub use error::DataError;
pub use flow::{DataFlow, Datapoint, DatapointContext, FlowState, Pass, Skipped};
pub use idx::{
    IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, IdxImages, parse_idx_images, parse_idx_labels,
    read_idx_images, read_idx_labels,
};
pub use images::LabeledImages;
pub use map::{MapData, MapDataComponent};
pub use mnist::{
    MNIST_CLASSES, MNIST10K_LEN, MNIST10K_TRAIN, MNIST10K_VALIDATION, TrainValidation, load_mnist,
    mnist10k, mnist10k_split, parse_mnist,
};
pub use prefetch::PrefetchData;
pub use repeat::{FixedSizeData, RepeatedData};
pub use rng::{RandomKey, permutation};
pub use shuffle::LocallyShuffleData;
pub use source::DataFromList;
pub use speed::{DataSpeed, test_data_speed};
