//! The precompiled-component cache: compiling the writer component with Cranelift takes
//! about 80 ms per process; loading it precompiled about 0.1 ms.

use wasmtime::Engine;
use wasmtime::component::Component;

/// The writer component: the reproducible build of `guest/` that ships in this crate
/// (`tests/tests/component.rs` checks it is byte-identical to a fresh build).
pub(crate) const GUEST_WASM: &[u8] = include_bytes!("../../component/dstl_guest.wasm");

/// Where compiled components are cached: `$DSTL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/dstl`, else `~/.cache/dstl`; `DSTL_CACHE_DIR=off` disables the cache.
fn cache_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("DSTL_CACHE_DIR") {
        Some(dir) if dir == "off" => None,
        Some(dir) => Some(dir.into()),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
            .map(|d| d.join("dstl")),
    }
}

/// Compiles the component, or loads it precompiled from the cache (about 80 ms of
/// Cranelift saved per process). The cache key covers the component's bytes, the
/// wasmtime version and every engine setting that affects compiled code, so a stale or
/// foreign entry is never loaded; a broken entry is compiled over.
pub(crate) fn load_component(engine: &Engine) -> wasmtime::Result<Component> {
    use std::hash::{Hash, Hasher};
    let Some(dir) = cache_dir() else {
        return Component::new(engine, GUEST_WASM);
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    GUEST_WASM.hash(&mut hasher);
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let path = dir.join(format!("writer-{:016x}.cwasm", hasher.finish()));
    if path.is_file() {
        // SAFETY: the file is one this code wrote into the user's own cache directory,
        // for exactly this component and engine configuration (the key above).
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring a broken cached component")
            }
        }
    }
    let component = Component::new(engine, GUEST_WASM)?;
    let stored = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let bytes = component
            .serialize()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let tmp = dir.join(format!(".{}.{}", uuid::Uuid::new_v4(), std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = stored {
        tracing::debug!(dir = %dir.display(), error = %e, "could not cache the compiled component");
    }
    Ok(component)
}
