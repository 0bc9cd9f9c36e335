//! The generated WIT bindings (world `dstl:changelog/changelog`) and conversions between
//! the generated types and the plain types of `dstl_proto::types`.

wasmtime::component::bindgen!({
    world: "changelog",
    path: "wit",
    // An import may trap its caller: the host refuses calls naming files the writer does
    // not hold (a guest fault).
    imports: { default: trappable },
});

/// The generated WIT types.
pub(crate) use self::dstl::changelog::types as wit;

dstl_proto::wit_conversions!(wit);
