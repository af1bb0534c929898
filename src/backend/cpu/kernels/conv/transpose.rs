//! The input gradient as a forward convolution: at stride 1, `dx` is the convolution of `dy`
//! (padded by the window's reach less the forward padding) with the spatially flipped filter,
//! each group's input and output channels swapped. The im2col + GEMM path, Winograd and the AMX
//! tiles compute stride-1 input gradients this way (the direct kernels gather per stride phase
//! instead: `direct_input`).

use super::{Conv2dGeometry, Padding2d};

/// The stride-1 forward convolution that computes `dx` from `dy`, when every side's padding is
/// at most the dilated window's reach (otherwise it would need negative padding).
pub(super) fn transposed_geometry(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
) -> Option<Conv2dGeometry> {
    if g.strides != [1, 1] {
        return None;
    }
    let reach = [
        g.dilations[0] * (g.kernel_hw[0] - 1),
        g.dilations[1] * (g.kernel_hw[1] - 1),
    ];
    let p = g.padding;
    let padding = Padding2d {
        top: reach[0].checked_sub(p.top)?,
        bottom: reach[0].checked_sub(p.bottom)?,
        left: reach[1].checked_sub(p.left)?,
        right: reach[1].checked_sub(p.right)?,
    };
    Some(Conv2dGeometry {
        batch: g.batch,
        in_hw: out_hw,
        in_channels: g.out_channels,
        out_channels: g.in_channels,
        kernel_hw: g.kernel_hw,
        strides: [1, 1],
        dilations: g.dilations,
        padding,
        groups: g.groups,
    })
}

/// The filter of [`transposed_geometry`]: spatially flipped, with each group's input and output
/// channels swapped (`[KH, KW, O/groups, C]`).
pub(super) fn flip_filter(g: &Conv2dGeometry, w: &[f32]) -> Vec<f32> {
    let [kh_len, kw_len] = g.kernel_hw;
    let (c, o, cg, og) = (g.in_channels, g.out_channels, g.group_in(), g.group_out());
    let mut flipped = vec![0.0; g.filter_len()];
    for kh in 0..kh_len {
        for kw in 0..kw_len {
            let src_tap = (kh_len - 1 - kh) * kw_len + (kw_len - 1 - kw);
            let dst_tap = kh * kw_len + kw;
            for group in 0..g.groups {
                for ol in 0..og {
                    for cl in 0..cg {
                        flipped[(dst_tap * og + ol) * c + group * cg + cl] =
                            w[(src_tap * cg + cl) * o + group * og + ol];
                    }
                }
            }
        }
    }
    flipped
}
