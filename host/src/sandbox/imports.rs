//! The host side of the component's imports, for one writer: the uploader, the registries
//! and logging. The guest is not trusted: a call naming a file the writer does not hold is
//! a [`GuestFault`], which traps the writer.

use super::bindings::dstl::changelog::{local_registry, logging, registry, uploader};
use super::bindings::{from_wit_task, wit};
use super::context::{GuestFault, WriterCtx};

impl wit::Host for WriterCtx {}

impl uploader::Host for WriterCtx {
    fn schedule(&mut self, task: wit::UploadTask) -> wasmtime::Result<Result<(), String>> {
        // Blocks while the in-flight limit is reached: that uses no CPU, so it does not
        // count against the call's deadline.
        let result =
            self.services
                .scheduler
                .submit(self.sink.clone(), self.id, from_wit_task(task));
        if result.is_ok() && !self.persisting {
            self.count_preemptive_upload();
        }
        // The WIT boundary: the guest gets the reason as text.
        Ok(result.map_err(|e| e.to_string()))
    }
}

impl registry::Host for WriterCtx {
    fn release(&mut self, handle: wit::StreamHandle) -> wasmtime::Result<()> {
        let local = self.holdings.release(&handle.path)?;
        self.services
            .registries
            .release(self.id, &handle.path, local);
        Ok(())
    }

    fn stop_tracking(&mut self, handle: wit::StreamHandle) -> wasmtime::Result<()> {
        let registries = &self.services.registries;
        if self.holdings.check(&handle.path, "stop-tracking")? {
            registries.local.stop_tracking(self.id, &handle.path);
        } else {
            registries.task.stop_tracking(&handle.path);
        }
        Ok(())
    }
}

impl local_registry::Host for WriterCtx {
    fn register(&mut self, handle: wit::StreamHandle, checkpoint: i64) -> wasmtime::Result<()> {
        if !self.holdings.check(&handle.path, "local register")? {
            return Err(GuestFault(format!(
                "local register of {}, a store file rather than a local copy",
                handle.path
            ))
            .into());
        }
        self.services
            .registries
            .local
            .register(self.id, &handle.path, checkpoint);
        Ok(())
    }

    fn discard_up_to(&mut self, checkpoint: i64) -> wasmtime::Result<Vec<String>> {
        let discarded = self
            .services
            .registries
            .local
            .discard_up_to(self.id, checkpoint);
        self.holdings.forget(&discarded);
        Ok(discarded)
    }
}

impl logging::Host for WriterCtx {
    fn log(&mut self, level: logging::Level, message: String) -> wasmtime::Result<()> {
        let writer = &self.name;
        match level {
            logging::Level::Trace => tracing::trace!(writer, "{message}"),
            logging::Level::Debug => tracing::debug!(writer, "{message}"),
            logging::Level::Info => tracing::info!(writer, "{message}"),
            logging::Level::Warn => tracing::warn!(writer, "{message}"),
            logging::Level::Error => tracing::error!(writer, "{message}"),
        }
        Ok(())
    }
}
