//! The mailbox: upload outcomes reach the guest serially with the writer's own calls.
//!
//! Both run only while holding the writer's lock. A writer call drains the mailbox before
//! and after itself; an outcome that arrives while the writer is idle is delivered at once
//! by the thread that produced it. A thread that finds the lock taken leaves its outcome
//! queued: whoever holds the lock looks at the mailbox again right after unlocking (the
//! [`super::core::Locked`] guard does, on every path), so an outcome waits at most for
//! the call that holds the writer now, never for a later one. Nothing ever waits for the
//! lock while holding another writer's lock, so delivery cannot deadlock.

use std::sync::TryLockError;

use super::core::{WriterCore, WriterState};
use crate::sync::LockExt;
use crate::upload::{OutcomeSink, UploadOutcome};

impl OutcomeSink for WriterCore {
    /// Queues an upload outcome and delivers it unless the writer is busy (then the
    /// writer's own call delivers it before returning).
    fn deliver(&self, outcome: UploadOutcome) {
        let _span = self.span.enter();
        self.mailbox.locked().push_back(outcome);
        self.pump();
    }
}

impl WriterCore {
    /// Delivers what waits, unless a call holds the writer (it pumps after unlocking).
    pub fn pump(&self) {
        loop {
            if self.mailbox.locked().is_empty() {
                return;
            }
            let mut state = match self.state.try_lock() {
                Ok(state) => state,
                Err(TryLockError::WouldBlock) => return,
                // Not a busy writer but a broken one: fail it and deliver to it anyway
                // (a writer without a sandbox releases the files of what it is handed),
                // so no outcome waits in the mailbox for good.
                Err(TryLockError::Poisoned(poisoned)) => self.recover(poisoned),
            };
            self.drain(&mut state);
        }
    }

    /// Delivers every waiting outcome to the guest.
    pub fn drain(&self, state: &mut WriterState) {
        loop {
            let Some(outcome) = self.mailbox.locked().pop_front() else {
                return;
            };
            if state.instance.is_none() {
                // The sandbox is gone: nobody will reference these files.
                if let UploadOutcome::Succeeded { results, .. } = outcome {
                    self.services.registries.release_results(self.id, &results);
                }
                continue;
            }
            if let UploadOutcome::Failed { task, error } = &outcome {
                state.book.failures.record(*task, error.clone());
            }
            // A trap is handled by `invoke` (the writer is poisoned, its persists fail).
            let _ = self.invoke(state, |instance, book| {
                let completions = instance.deliver(outcome)?;
                book.tickets
                    .resolve(&self.name, completions, &book.failures, &|snapshot| {
                        self.acknowledge(snapshot)
                    });
                Ok(Ok(()))
            });
        }
    }
}
