//! Histograms the way TensorFlow summarizes them: TF's default bucket boundaries (growing by 10%
//! from 1e-12 to 1e20, mirrored for negatives, plus 0 and ±`f64::MAX`) and its encoding, which
//! merges each run of empty buckets into one entry.

use std::sync::OnceLock;

use super::MonitorError;
use super::proto::HistogramProto;

/// TF's default bucket upper limits (`InitDefaultBucketsInner` in `lib/histogram/histogram.cc`).
pub fn default_bucket_limits() -> &'static [f64] {
    static LIMITS: OnceLock<Vec<f64>> = OnceLock::new();
    LIMITS.get_or_init(|| {
        let mut positive = Vec::new();
        let mut v = 1.0e-12;
        while v < 1.0e20 {
            positive.push(v);
            v *= 1.1;
        }
        positive.push(f64::MAX);
        let mut limits: Vec<f64> = positive.iter().rev().map(|x| -x).collect();
        limits.push(0.0);
        limits.extend_from_slice(&positive);
        limits
    })
}

/// Summarizes `values` with TF's default buckets.
///
/// Like `tf.summary.histogram`, a NaN or infinite value is an error (it names `tag`).
pub fn histogram_of(tag: &str, values: &[f64]) -> Result<HistogramProto, MonitorError> {
    let limits = default_bucket_limits();
    let mut counts = vec![0.0f64; limits.len()];
    let (mut min, mut max) = (f64::MAX, -f64::MAX);
    let (mut sum, mut sum_squares) = (0.0f64, 0.0f64);
    for (index, &v) in values.iter().enumerate() {
        if !v.is_finite() {
            return Err(MonitorError::NonFiniteHistogram {
                tag: tag.to_string(),
                index,
                value: v,
            });
        }
        // The bucket is the first limit strictly greater than `v` (C++ `upper_bound`); the last
        // limit is f64::MAX, so only v == f64::MAX falls past the end and joins the last bucket.
        let bucket = limits.partition_point(|&l| l <= v).min(limits.len() - 1);
        counts[bucket] += 1.0;
        min = min.min(v);
        max = max.max(v);
        sum += v;
        sum_squares += v * v;
    }
    let mut bucket_limit = Vec::new();
    let mut bucket = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let mut end = limits[i];
        let mut count = counts[i];
        i += 1;
        if count <= 0.0 {
            // Collapse a run of empty buckets into one entry (TF's `preserve_zero_buckets=false`).
            while i < counts.len() && counts[i] <= 0.0 {
                end = limits[i];
                count = counts[i];
                i += 1;
            }
        }
        bucket_limit.push(end);
        bucket.push(count);
    }
    Ok(HistogramProto {
        min,
        max,
        num: values.len() as f64,
        sum,
        sum_squares,
        bucket_limit,
        bucket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_sorted_and_symmetric() {
        let limits = default_bucket_limits();
        assert!(limits.windows(2).all(|w| w[0] < w[1]));
        let n = limits.len();
        assert_eq!(n % 2, 1);
        assert_eq!(limits[n / 2], 0.0);
        assert_eq!(limits[n - 1], f64::MAX);
        for i in 0..n / 2 {
            assert_eq!(limits[i], -limits[n - 1 - i]);
        }
    }

    #[test]
    fn counts_land_in_the_bucket_whose_limit_first_exceeds_the_value() {
        let values = [0.0, 0.0, 1.0, -1.0, 3.5e-7, -2.0e9];
        let h = histogram_of("h", &values).expect("finite values");
        assert_eq!(h.num, values.len() as f64);
        assert_eq!(h.bucket.iter().sum::<f64>(), values.len() as f64);
        assert_eq!((h.min, h.max), (-2.0e9, 1.0));
        // Each emitted non-empty bucket holds exactly the values in [previous limit, limit).
        let limits = default_bucket_limits();
        for (limit, count) in h.bucket_limit.iter().zip(&h.bucket) {
            if *count > 0.0 {
                let idx = limits
                    .iter()
                    .position(|l| l == limit)
                    .expect("a default limit");
                let lower = if idx == 0 { f64::MIN } else { limits[idx - 1] };
                let inside = values.iter().filter(|&&v| lower <= v && v < *limit).count();
                assert_eq!(inside as f64, *count, "bucket ending at {limit}");
            }
        }
        // Zero's bucket ends at the first positive limit.
        let zero_slot = h.bucket_limit.iter().position(|&l| l == 1.0e-12);
        assert_eq!(zero_slot.map(|i| h.bucket[i]), Some(2.0));
    }

    #[test]
    fn empty_and_non_finite() {
        let h = histogram_of("h", &[]).expect("empty is fine");
        assert_eq!((h.min, h.max, h.num), (f64::MAX, -f64::MAX, 0.0));
        assert_eq!(
            h.bucket,
            vec![0.0],
            "all empty buckets collapse into one entry"
        );
        let err = histogram_of("w", &[1.0, f64::NAN]).unwrap_err();
        assert!(err.to_string().contains("w"), "{err}");
    }
}
