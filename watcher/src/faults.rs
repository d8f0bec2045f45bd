//! Test support (feature `test-support`, never in the shipped binaries): makes one of the
//! watcher's tasks end or panic the next time it handles its input, so that a test can see the
//! watcher stop with an error naming it ([`crate::supervise::WatcherError`], docs/watcher.md).
//!
//! ```ignore
//! let mut config = clb_watcher::WatcherConfig::new(server, mode);
//! config.faults.inject(clb_watcher::supervise::WRITE_BACK, Fault::Panic);
//! ```

use std::sync::{Arc, Mutex};

/// What a task does at its next fault point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It returns, as if its input had ended.
    End,
    /// It panics.
    Panic,
}

/// The faults armed for the tasks of one watcher (shared by the clones of its configuration).
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<Vec<(&'static str, Fault)>>>);

impl Faults {
    /// Task `task` (one of the names in [`crate::supervise`]) fails with `fault` the next time
    /// it reaches a fault point (when it next handles its input).
    pub fn inject(&self, task: &'static str, fault: Fault) {
        self.lock().push((task, fault));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Fault)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// At a fault point of `task`: panics if a panic was injected, returns whether an end was.
    pub(crate) fn hit(&self, task: &'static str) -> bool {
        let fault = {
            let mut armed = self.lock();
            let i = armed.iter().position(|(t, _)| *t == task);
            i.map(|i| armed.remove(i).1)
        };
        match fault {
            None => false,
            Some(Fault::End) => true,
            Some(Fault::Panic) => panic!("a panic injected by a test into the {task}"),
        }
    }
}
