//! Exports `dstl_proto::ownership` through the WIT interface `ownership`: the rules of
//! file ownership for hosts that cannot link dstl-proto (the Node host). Each resource is
//! the proto type behind a `RefCell` (a resource's methods take `&self`); conversions only.

use std::cell::RefCell;

use dstl_proto::ownership::{self as rules, Released, Tracking};

use crate::component::exports::dstl::changelog::ownership::{
    self as wit, GuestHoldings, GuestLocalClaims, GuestTaskRefs,
};
use crate::component::{dstl::changelog::types as types_wit, from_wit_result, from_wit_snapshot};

fn released(r: Released) -> wit::Released {
    match r {
        Released::Kept => wit::Released::Kept,
        Released::Delete => wit::Released::Delete,
        Released::Untracked => wit::Released::Untracked,
    }
}

/// `task-refs`: [`rules::TaskRefs`].
pub struct TaskRefsResource(RefCell<rules::TaskRefs>);

impl GuestTaskRefs for TaskRefsResource {
    fn new() -> Self {
        Self(RefCell::default())
    }

    fn start_tracking(&self, path: String, count: u64) -> wit::Tracking {
        match self.0.borrow_mut().start_tracking(&path, count) {
            Tracking::Started => wit::Tracking::Started,
            Tracking::Replaced => wit::Tracking::Replaced,
            Tracking::Empty => wit::Tracking::Empty,
        }
    }

    fn stop_tracking(&self, path: String) {
        self.0.borrow_mut().stop_tracking(&path)
    }

    fn release(&self, path: String) -> wit::Released {
        released(self.0.borrow_mut().release(&path))
    }

    fn count(&self, path: String) -> Option<u64> {
        self.0.borrow().count(&path)
    }

    fn tracked(&self) -> u64 {
        self.0.borrow().tracked() as u64
    }
}

/// `local-claims`: [`rules::LocalClaims`].
pub struct LocalClaimsResource(RefCell<rules::LocalClaims>);

impl GuestLocalClaims for LocalClaimsResource {
    fn new() -> Self {
        Self(RefCell::default())
    }

    fn hold(&self, writer: u64, path: String, count: u64) {
        self.0.borrow_mut().hold(writer, &path, count)
    }

    fn release(&self, writer: u64, path: String) -> wit::Released {
        released(self.0.borrow_mut().release(writer, &path))
    }

    fn stop_tracking(&self, writer: u64, path: String) -> wit::Released {
        released(self.0.borrow_mut().stop_tracking(writer, &path))
    }

    fn register(&self, writer: u64, path: String, checkpoint: i64) {
        self.0.borrow_mut().register(writer, &path, checkpoint)
    }

    fn discard_up_to(&self, writer: u64, checkpoint: i64) -> wit::Discarded {
        let d = self.0.borrow_mut().discard_up_to(writer, checkpoint);
        wit::Discarded {
            forgotten: d.forgotten,
            delete: d.delete,
        }
    }

    fn claims(&self, writer: u64, path: String) -> bool {
        self.0.borrow().claims(writer, &path)
    }
}

/// `holdings`: [`rules::Holdings`]; a guest fault crosses as its message.
pub struct HoldingsResource(RefCell<rules::Holdings>);

impl GuestHoldings for HoldingsResource {
    fn new() -> Self {
        Self(RefCell::default())
    }

    fn add(&self, results: Vec<types_wit::UploadResult>) {
        let results: Vec<_> = results.into_iter().map(from_wit_result).collect();
        self.0.borrow_mut().add(&results)
    }

    fn check(&self, path: String, operation: String) -> Result<bool, String> {
        self.0
            .borrow()
            .check(&path, &operation)
            .map_err(|f| f.to_string())
    }

    fn release(&self, path: String) -> Result<bool, String> {
        self.0
            .borrow_mut()
            .release(&path)
            .map_err(|f| f.to_string())
    }

    fn hand_out(&self, snapshot: types_wit::SnapshotResult) -> Result<(), String> {
        self.0
            .borrow_mut()
            .hand_out(&from_wit_snapshot(snapshot))
            .map_err(|f| f.to_string())
    }

    fn forget(&self, paths: Vec<String>) {
        self.0.borrow_mut().forget(&paths)
    }

    fn take_unreturned(&self) -> Vec<wit::Holding> {
        self.0
            .borrow_mut()
            .take_unreturned()
            .into_iter()
            .map(|(path, h)| wit::Holding {
                path,
                refs: h.refs,
                local: h.local,
            })
            .collect()
    }
}
