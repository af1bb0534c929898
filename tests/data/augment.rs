//! Image augmentations on HWC `u8` and `f32` images, checked against direct index arithmetic on
//! random images, and their determinism per `(seed, pass, index)`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use towerpack::data::{
    AugmentImageComponent, CenterPaste, DataFlow, DataFromList, Flip, ImageAugmentor, Normalize,
    RandomCrop, RandomKey,
};
use towerpack::tensor::{DType, HostTensor};

fn random_image(dtype: DType, h: usize, w: usize, c: usize, seed: u64) -> HostTensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let px: Vec<f64> = (0..h * w * c)
        .map(|_| f64::from(rng.random::<u8>()))
        .collect();
    HostTensor::from_f64_values(dtype, &[h, w, c], px).expect("image")
}

fn at(img: &HostTensor, y: usize, x: usize, c: usize) -> f64 {
    let [_, w, ch] = *img.shape() else {
        panic!("HWC")
    };
    img.to_f64_vec()[(y * w + x) * ch + c]
}

const KEY: fn(u64) -> RandomKey = |i| RandomKey::new(1, 0, i);

#[test]
fn center_paste_pads_to_size() {
    for dtype in [DType::U8, DType::F32] {
        let img = random_image(dtype, 5, 4, 3, 1);
        let paste = CenterPaste {
            height: 9,
            width: 8,
            background: 7.0,
        };
        let out = paste.augment(img.clone(), KEY(0)).expect("paste");
        assert_eq!(out.shape(), &[9, 8, 3]);
        assert_eq!(out.dtype(), dtype);
        for y in 0..9 {
            for x in 0..8 {
                for c in 0..3 {
                    let inside = (2..7).contains(&y) && (2..6).contains(&x);
                    let want = if inside {
                        at(&img, y - 2, x - 2, c)
                    } else {
                        7.0
                    };
                    assert_eq!(at(&out, y, x, c), want, "{dtype} {y} {x} {c}");
                }
            }
        }
        let err = CenterPaste::new(4, 4).augment(img, KEY(0)).unwrap_err();
        assert!(err.to_string().contains("5x4 does not fit in 4x4"), "{err}");
    }
}

#[test]
fn random_crop_takes_a_window_and_covers_every_offset() {
    for dtype in [DType::U8, DType::F32] {
        let img = random_image(dtype, 7, 6, 2, 2);
        let crop = RandomCrop::new(4, 4);
        let mut offsets = std::collections::BTreeSet::new();
        for i in 0..400 {
            let out = crop.augment(img.clone(), KEY(i)).expect("crop");
            assert_eq!(
                out,
                crop.augment(img.clone(), KEY(i)).expect("crop"),
                "deterministic"
            );
            assert_eq!(out.shape(), &[4, 4, 2]);
            // Find the offset by matching the whole window.
            let found: Vec<(usize, usize)> = (0..=3)
                .flat_map(|y0| (0..=2).map(move |x0| (y0, x0)))
                .filter(|&(y0, x0)| {
                    (0..4).all(|y| {
                        (0..4).all(|x| {
                            (0..2).all(|c| at(&out, y, x, c) == at(&img, y0 + y, x0 + x, c))
                        })
                    })
                })
                .collect();
            assert_eq!(found.len(), 1, "exactly one window matches");
            offsets.insert(found[0]);
        }
        assert_eq!(offsets.len(), 4 * 3, "every offset is drawn: {offsets:?}");
        assert!(
            crop.augment(random_image(dtype, 3, 6, 1, 1), KEY(0))
                .is_err()
        );
    }
}

#[test]
fn flip_mirrors_about_half_the_time() {
    for dtype in [DType::U8, DType::F32] {
        let img = random_image(dtype, 3, 5, 3, 3);
        let flip = Flip::horizontal();
        let n = 2000;
        let mut flipped = 0;
        for i in 0..n {
            let out = flip.augment(img.clone(), KEY(i)).expect("flip");
            if out != img {
                flipped += 1;
                for y in 0..3 {
                    for x in 0..5 {
                        for c in 0..3 {
                            assert_eq!(at(&out, y, x, c), at(&img, y, 4 - x, c));
                        }
                    }
                }
            }
        }
        let rate = flipped as f64 / n as f64;
        assert!((rate - 0.5).abs() < 0.05, "flip rate {rate}");
        let always = Flip { probability: 1.0 };
        let twice = always
            .augment(always.augment(img.clone(), KEY(0)).expect("f"), KEY(1))
            .expect("f");
        assert_eq!(twice, img);
    }
}

#[test]
fn normalize_per_channel_and_mean_image() {
    let img = random_image(DType::U8, 4, 3, 3, 4);
    let mean = vec![120.0, 110.0, 100.0];
    let std = vec![60.0, 50.0, 40.0];
    let out = Normalize::per_channel(mean.clone(), std.clone())
        .augment(img.clone(), KEY(0))
        .expect("n");
    assert_eq!(out.dtype(), DType::F32);
    for y in 0..4 {
        for x in 0..3 {
            for c in 0..3 {
                let want = (at(&img, y, x, c) - f64::from(mean[c])) / f64::from(std[c]);
                assert!((at(&out, y, x, c) - want).abs() < 1e-5, "{y} {x} {c}");
            }
        }
    }
    let mean_img = random_image(DType::F32, 4, 3, 3, 5);
    let out = Normalize::mean_image(&mean_img)
        .augment(img.clone(), KEY(0))
        .expect("n");
    for y in 0..4 {
        for x in 0..3 {
            for c in 0..3 {
                assert_eq!(
                    at(&out, y, x, c),
                    at(&img, y, x, c) - at(&mean_img, y, x, c)
                );
            }
        }
    }
    assert!(
        Normalize::per_channel(vec![0.0], vec![1.0])
            .augment(img.clone(), KEY(0))
            .is_err()
    );
    let rank2 = HostTensor::from_f32(&[2, 2], vec![0.0; 4]).expect("2x2");
    let err = Flip::horizontal().augment(rank2, KEY(0)).unwrap_err();
    assert!(err.to_string().contains("rank 3"), "{err}");
}

#[test]
fn augment_component_is_a_function_of_seed_pass_and_index() {
    let img = random_image(DType::U8, 6, 6, 1, 6);
    let dps: Vec<_> = (0..8).map(|_| vec![img.clone()]).collect();
    let build = |seed| {
        let augs: Vec<Arc<dyn ImageAugmentor>> = vec![
            Arc::new(CenterPaste::new(10, 10)),
            Arc::new(RandomCrop::new(6, 6)),
            Arc::new(Flip::horizontal()),
        ];
        let mut flow = AugmentImageComponent::new(DataFromList::new(dps.clone()), 0, augs, seed);
        flow.reset_state().expect("reset");
        flow
    };
    let (mut a, mut b, mut c) = (build(1), build(1), build(2));
    let pa: Vec<_> = (0..2).map(|_| a.collect_pass().expect("pass")).collect();
    let pb: Vec<_> = (0..2).map(|_| b.collect_pass().expect("pass")).collect();
    let pc = c.collect_pass().expect("pass");
    assert_eq!(pa, pb, "same seed, same augmentations");
    assert_ne!(pa[0], pa[1], "another pass draws anew");
    assert_ne!(pa[0], pc, "another seed draws anew");
    assert!(
        pa[0].windows(2).any(|w| w[0] != w[1]),
        "datapoints of one pass differ"
    );
    for dp in &pa[0] {
        assert_eq!(dp[0].shape(), &[6, 6, 1]);
    }
}
