//! The dstl rules component: exports the rules of file ownership (`ownership.rs`), the
//! upload policy (`policy.rs`), the configuration keys (`settings.rs`) and the JSON
//! records (`records.rs`: manifest and lease) of `dstl-proto`
//! through the WIT world `dstl:changelog/rules`, for hosts that cannot link dstl-proto
//! (the Node host). It imports nothing of dstl.
//!
//! It is a component of its own, not part of the writer component, because a host
//! instantiates the writer once per operator but needs the rules once per storage: jco's
//! glue builds every exported resource's classes per instance, so rules exported by the
//! writer would cost every writer instance time and memory for code it never calls.
//!
//! The bindings compile only for `wasm32`; natively this crate is empty (the logic and
//! its unit tests live in `dstl-proto`).

#[cfg(target_arch = "wasm32")]
mod ownership;
#[cfg(target_arch = "wasm32")]
mod policy;
#[cfg(target_arch = "wasm32")]
mod records;
#[cfg(target_arch = "wasm32")]
mod settings;

#[cfg(target_arch = "wasm32")]
mod component {
    wit_bindgen::generate!({
        world: "rules",
        path: "wit",
    });

    pub(crate) use dstl::changelog::types as wit;
    use exports::dstl::changelog::ownership::Guest as OwnershipGuest;
    use exports::dstl::changelog::policy::Guest as PolicyGuest;

    dstl_proto::wit_conversions!(wit);

    /// What the component exports (`settings.rs` and `records.rs` implement their
    /// interfaces' functions on it).
    pub(crate) struct Component;

    impl OwnershipGuest for Component {
        type TaskRefs = crate::ownership::TaskRefsResource;
        type LocalClaims = crate::ownership::LocalClaimsResource;
        type Holdings = crate::ownership::HoldingsResource;
    }

    impl PolicyGuest for Component {
        type Retry = crate::policy::RetryResource;
        type Batcher = crate::policy::BatcherResource;
        type HandOff = crate::policy::HandOffResource;
    }

    export!(Component);
}
