//! The tie between one profiler and the observable callbacks it registered on a provider
//! (`Attachment`): the callbacks of the contract's instruments (`aggregate.rs`) and of the
//! engine-state gauges (`engine.rs`) read their tables through it, and dropping the profiler
//! detaches them.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Whether one profiler's observable callbacks still observe. The SDK keeps a callback for the
/// life of its provider (the API has no way to unregister one), so the callbacks of a profiler
/// dropped and built again on the engine's provider would go on reporting the dropped one's
/// frozen totals beside the new one's, on the same series. Dropping the profiler detaches
/// them: from then on each observes nothing (one load per collection). The callbacks hold the
/// tables they read weakly, and the attachment holds them until it is detached, so what stays
/// with the provider after the drop is the closures alone.
#[derive(Clone, Default)]
pub(crate) struct Attachment(Arc<AttachmentState>);

#[derive(Default)]
struct AttachmentState {
    detached: AtomicBool,
    /// The tables the callbacks read, kept alive while attached (after `shutdown()` too).
    keep: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Attachment {
    /// From now on the callbacks observe nothing, and their tables are let go.
    pub(crate) fn detach(&self) {
        self.0.detached.store(true, Ordering::Release);
        self.0
            .keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// A weak handle on `table` for a callback, `table` kept alive until the detach.
    pub(super) fn hold<T: Send + Sync + 'static>(&self, table: &Arc<T>) -> Weak<T> {
        let kept: Arc<dyn Any + Send + Sync> = table.clone();
        self.0
            .keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(kept);
        Arc::downgrade(table)
    }

    /// The table a callback reads, while attached.
    pub(super) fn read<T>(&self, table: &Weak<T>) -> Option<Arc<T>> {
        if self.0.detached.load(Ordering::Acquire) {
            return None;
        }
        table.upgrade()
    }
}
