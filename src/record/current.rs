//! The current thread's recorder, for code that has no handle to one: a model's layers
//! (`forward` functions), a kernel's launch site, a library the engine calls.
//!
//! ```text
//! engine thread start:  let rec = current::install(profiler.recorder());  (or
//!                       Profiler::install_thread_recorder)
//! anywhere below it:    let _s = current::section(Section::MLP_DENSE, layer, Site::MLP);
//!                       ── thread-local slot ── Recorder::section's marks, same lane
//! thread's loop ends:   drop(rec): the slot is cleared, the recorder dropped (its lane drained
//!                       and forgotten by the worker)
//! ```
//!
//! The slot is a `thread_local!` with a constant initializer: reading it is a thread-pointer
//! offset and a `RefCell` flag check, no lock and no atomic. On a thread with no recorder
//! installed, every call here records nothing. Nothing is leaked: the recorder lives in the
//! slot while its [`Installed`] guard lives (and at most until the thread exits).

use super::Recorder;
use super::mark::Mark;
use crate::vocab::{Layer, Section, Site};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

thread_local! {
    static CURRENT: RefCell<Option<Rc<Recorder>>> = const { RefCell::new(None) };
}

/// The recorder installed on this thread by [`install`]: it records what the free functions
/// of [`crate::current`] record on this thread, and derefs to the [`Recorder`] for the engine's
/// own calls (steps, requests, rounds), which then share its lane with the model's sections.
///
/// Dropping it uninstalls the recorder (the one installed before it, if any, is current again)
/// and drops it. Not `Send`: it belongs to the thread it was installed on.
#[must_use = "the recorder is uninstalled when this guard is dropped"]
pub struct Installed {
    rec: Rc<Recorder>,
    /// What was installed before, put back on drop.
    previous: Option<Rc<Recorder>>,
    /// Whether the slot took `rec` (not when installed from inside [`with`]).
    installed: bool,
}

impl std::fmt::Debug for Installed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Installed")
            .field("recorder", &self.rec)
            .field("installed", &self.installed)
            .finish()
    }
}

impl std::ops::Deref for Installed {
    type Target = Recorder;

    fn deref(&self) -> &Recorder {
        &self.rec
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if !self.installed {
            return;
        }
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|slot| {
            // Busy only inside `with` on this thread: the recorder then stays current until
            // the thread exits, and is dropped with the thread's locals.
            if let Ok(mut slot) = slot.try_borrow_mut()
                && slot.as_ref().is_some_and(|r| Rc::ptr_eq(r, &self.rec))
            {
                // The old value is dropped after the borrow ends (`Recorder::drop` runs no
                // code of ours that reads the slot, but keep the borrow short anyway).
                let mine = std::mem::replace(&mut *slot, previous);
                drop(slot);
                drop(mine);
            }
        });
    }
}

/// Makes `rec` this thread's current recorder until the returned guard drops: the free
/// functions of [`crate::current`] ([`section`], [`host_section`], [`with`]) record on it from
/// any code this thread runs. Install it where the thread starts its loop (the engine's
/// model thread), and use the guard (it derefs to the recorder) for the engine's own calls.
///
/// Installing over another recorder makes the new one current; dropping the guard makes the
/// previous one current again (drop guards in the reverse order of their installs).
/// Installing from inside a [`with`] closure cannot change the slot: the guard then records
/// nothing through the free functions (still through itself), and says so once on stderr.
///
/// ```
/// use phasetrace::{current, Profiler, Section, SectionLevel, Site};
///
/// /// A layer's forward, deep in model code: no recorder in sight.
/// fn mlp_forward(layer: u32) {
///     let _s = current::section(Section::MLP_DENSE, layer, Site::MLP);
///     // ... the layer's kernels
/// }
///
/// let profiler = Profiler::builder()
///     .without_env()
///     .with_level(SectionLevel::Full)
///     .without_prometheus()
///     .build()?;
/// let rec = current::install(profiler.recorder());
/// for _token in 0..3 {
///     let _step = rec.step();
///     for layer in 0..4 {
///         mlp_forward(layer);
///     }
/// }
/// drop(rec);
/// profiler.flush();
/// assert_eq!((profiler.stats().steps, profiler.stats().sections), (3, 12));
/// profiler.shutdown();
/// # Ok::<(), phasetrace::Error>(())
/// ```
pub fn install(rec: Recorder) -> Installed {
    let rec = Rc::new(rec);
    let mut guard = Installed {
        rec: rec.clone(),
        previous: None,
        installed: false,
    };
    let _ = CURRENT.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            guard.previous = slot.replace(rec);
            guard.installed = true;
        }
    });
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !guard.installed && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::diag::warning!(
            "phasetrace::current::install was called inside phasetrace::current::with: the \
             recorder is not made current; record through the returned guard (said once)"
        );
    }
    guard
}

/// Runs `f` with this thread's current recorder ([`install`]), or returns `None` when none is
/// installed: for the recorder's other calls from code with no handle (`collective_wait`,
/// `moe_route`, `serve`). Cost: a thread-local read and a `RefCell` flag check on top of `f`.
#[inline]
pub fn with<R>(f: impl FnOnce(&Recorder) -> R) -> Option<R> {
    CURRENT
        .try_with(|slot| {
            let slot = slot.try_borrow().ok()?;
            slot.as_deref().map(f)
        })
        .ok()
        .flatten()
}

/// Whether a recorder is installed on this thread ([`install`]).
pub fn is_installed() -> bool {
    with(|_| ()).is_some()
}

/// Times a section on this thread's current recorder: what [`Recorder::section`] does on the
/// recorder that [`install`] made current, and nothing on a thread without one. The section
/// ends when the guard drops, on the recorder it began on.
///
/// Cost: on top of [`Recorder::section`]'s, a thread-local read, a `RefCell` flag check and a
/// reference count (non-atomic) taken and released; with no recorder installed, the
/// thread-local read alone. Measured (`current_thread_section/*`): [`crate::benchmarks`].
#[inline]
#[must_use = "the section ends when the guard is dropped"]
pub fn section(section: Section, layer: impl Into<Layer>, site: Site) -> CurrentSection {
    section_on(section, layer.into(), site, false)
}

/// [`section`] on the host clock only: what [`Recorder::host_section`] does.
#[inline]
#[must_use = "the section ends when the guard is dropped"]
pub fn host_section(section: Section, layer: impl Into<Layer>, site: Site) -> CurrentSection {
    section_on(section, layer.into(), site, true)
}

#[inline]
fn section_on(section: Section, layer: Layer, site: Site, host: bool) -> CurrentSection {
    let rec = CURRENT
        .try_with(|slot| {
            let slot = slot.try_borrow().ok()?;
            let rec = slot.as_ref()?;
            (Recorder::records(rec.level(), section)
                && rec.push_timed(Mark::section_begin(section, layer, site, host)))
            .then(|| rec.clone())
        })
        .ok()
        .flatten();
    CurrentSection {
        rec,
        section,
        host,
        _not_send: PhantomData,
    }
}

/// An open section of the current thread's recorder ([`section`]); ends on drop. Not `Send`:
/// it ends on the thread it began on, for a section across an `.await` use
/// [`Recorder::begin_section`] / [`Recorder::end_section`] on a recorder the task owns.
#[must_use = "the section ends when the guard is dropped"]
pub struct CurrentSection {
    /// The recorder it began on; `None`: nothing recorded (none installed, or off).
    rec: Option<Rc<Recorder>>,
    section: Section,
    host: bool,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for CurrentSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentSection")
            .field("section", &self.section)
            .field("recorded", &self.rec.is_some())
            .finish()
    }
}

impl CurrentSection {
    /// Ends the section now.
    pub fn end(self) {}
}

impl Drop for CurrentSection {
    #[inline]
    fn drop(&mut self) {
        if let Some(rec) = self.rec.take() {
            rec.push_timed(Mark::section_end(self.section, self.host));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Profiler, SectionLevel};

    fn profiler() -> Profiler {
        Profiler::builder()
            .without_env()
            .with_level(SectionLevel::Full)
            .without_prometheus()
            .build()
            .expect("a profiler without exporters builds")
    }

    #[test]
    fn an_uninstalled_recorder_is_dropped_and_a_section_keeps_its_recorder_to_its_end() {
        let p = profiler();
        let installed = install(p.recorder());
        let weak = Rc::downgrade(&installed.rec);
        let open = section(Section::KDA_MIXER, 0u32, Site::ATTN);
        drop(installed);
        assert!(!is_installed());
        // The open section still holds its recorder, so its end lands on the same lane.
        assert!(weak.upgrade().is_some());
        drop(open);
        assert!(
            weak.upgrade().is_none(),
            "the recorder is dropped, not leaked"
        );
        p.flush();
        let s = p.stats();
        assert_eq!((s.sections, s.dropped.total()), (1, 0), "{s:?}");
        p.shutdown();
    }

    #[test]
    fn installing_inside_with_leaves_the_slot_alone_and_records_through_the_guard() {
        let p = profiler();
        let outer = install(p.recorder());
        let inner = with(|_| install(p.recorder())).expect("a recorder is installed");
        assert!(!inner.installed);
        {
            let _step = inner.step();
        }
        assert!(with(|r| std::ptr::eq(r, &*outer)).unwrap_or(false));
        drop(inner);
        assert!(with(|r| std::ptr::eq(r, &*outer)).unwrap_or(false));
        drop(outer);
        assert!(!is_installed());
        p.flush();
        assert_eq!(p.stats().steps, 1);
        p.shutdown();
    }
}
