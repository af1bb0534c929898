//! Layer arguments that would build a model ignoring its input (`units = 0`, `filters = 0`, a
//! window or stride of 0, an input with no features) are errors naming the layer's scoped name,
//! never a graph that trains on nothing.

use towerpack::dsl::prelude::*;
use towerpack::graph;
use towerpack::ir::Graph;

fn image_sig(h: usize, c: usize) -> Vec<InputSpec> {
    vec![InputSpec::new(
        "image",
        DType::F32,
        Shape::batched(&[h, h, c]),
    )]
}

/// Builds one training tower around `f` (inside variable scope `block`), cost = sum of output.
fn build(sig: &[InputSpec], f: impl Fn(&Tensor) -> Tensor) -> Result<Graph, DslError> {
    let b = Builder::with_seed(3);
    b.build_tower(TowerContext::training("", "", 0, 1), sig, |x| {
        let _scope = variable_scope("block");
        f(&x[0]).sum()
    })?;
    b.finish()
}

/// Asserts that `err` is a layer error of `layer` (`kind`) whose message contains `needle`.
fn assert_layer_error(err: DslError, layer: &str, kind: &str, needle: &str) {
    match &err {
        DslError::Layer {
            layer: l,
            kind: k,
            message,
        } => {
            assert_eq!(l, layer, "{err}");
            assert_eq!(*k, kind, "{err}");
            assert!(message.contains(needle), "`{needle}` not in: {err}");
        }
        other => panic!("expected a layer error of {layer}, got {other:?}"),
    }
    assert!(err.to_string().contains(layer), "{err}");
}

#[test]
fn zero_units_name_the_fully_connected_layer() {
    let err = build(&image_sig(4, 1), |x| {
        graph! { FullyConnected("fc0", x, units = 0) }
    })
    .expect_err("units = 0");
    assert_layer_error(
        err,
        "block/fc0",
        "FullyConnected",
        "`units` must be at least 1, got 0",
    );
}

#[test]
fn zero_filters_name_the_convolution() {
    let err = build(&image_sig(8, 3), |x| {
        graph! { Conv2D("conv0", x, filters = 0, kernel_size = 3) }
    })
    .expect_err("filters = 0");
    assert_layer_error(err, "block/conv0", "Conv2D", "`filters` must be at least 1");

    let err = build(&image_sig(8, 3), |x| {
        Conv2DTranspose("deconv", x)
            .filters(0)
            .kernel_size(3)
            .build()
    })
    .expect_err("filters = 0");
    assert_layer_error(
        err,
        "block/deconv",
        "Conv2DTranspose",
        "`filters` must be at least 1",
    );
}

/// A layer applied to an input tensor.
type LayerCall = Box<dyn Fn(&Tensor) -> Tensor>;

#[test]
fn zero_windows_and_strides_are_errors() {
    let cases: Vec<(&str, &str, LayerCall)> = vec![
        (
            "Conv2D",
            "`kernel_size`",
            Box::new(|x| Conv2D("l", x).filters(4).kernel_size([0, 3]).build()),
        ),
        (
            "Conv2D",
            "`strides`",
            Box::new(|x| Conv2D("l", x).filters(4).kernel_size(3).strides(0).build()),
        ),
        (
            "Conv2D",
            "`dilation_rate`",
            Box::new(|x| {
                Conv2D("l", x)
                    .filters(4)
                    .kernel_size(3)
                    .dilation_rate(0)
                    .build()
            }),
        ),
        (
            "MaxPooling",
            "`pool_size`",
            Box::new(|x| MaxPooling("l", x).pool_size(0).build()),
        ),
        (
            "AvgPooling",
            "`strides`",
            Box::new(|x| AvgPooling("l", x).pool_size(2).strides([1, 0]).build()),
        ),
    ];
    for (kind, needle, f) in cases {
        let err = build(&image_sig(8, 3), f).expect_err(kind);
        assert_layer_error(err, "block/l", kind, needle);
    }
}

#[test]
fn inputs_without_features_are_errors() {
    let no_channels = image_sig(8, 0);
    let err = build(&no_channels, |x| {
        Conv2D("conv0", x).filters(4).kernel_size(3).build()
    })
    .expect_err("0 channels");
    assert_layer_error(err, "block/conv0", "Conv2D", "is empty");

    let no_features = vec![InputSpec::new("x", DType::F32, Shape::batched(&[0]))];
    let err =
        build(&no_features, |x| FullyConnected("fc", x).units(3).build()).expect_err("0 features");
    assert_layer_error(err, "block/fc", "FullyConnected", "0 features");
}

#[test]
fn sizes_of_one_still_build() {
    // The checks reject 0 only: the smallest real layers stay valid.
    let g = build(&image_sig(4, 1), |x| {
        let l = Conv2D("conv", x).filters(1).kernel_size(1).build();
        let l = MaxPooling("pool", l).pool_size(1).build();
        FullyConnected("fc", l).units(1).build()
    })
    .expect("size-1 layers");
    assert!(g.find_variable("block/fc/W").is_some());
}
