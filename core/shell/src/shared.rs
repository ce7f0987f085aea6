//! The front request handlers read, swapped whole on reload.

use std::sync::{Arc, RwLock};

/// A value request handlers read and a reload replaces whole: one `Arc` behind a lock held
/// only to clone or swap it, so a request sees the old value or the new, never a mix.
#[derive(Debug)]
pub struct Shared<T>(RwLock<Arc<T>>);

impl<T> Shared<T> {
    /// Shares `value`.
    pub fn new(value: Arc<T>) -> Self {
        Shared(RwLock::new(value))
    }

    /// The value now.
    pub fn get(&self) -> Arc<T> {
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces it for every later [`Shared::get`].
    pub fn set(&self, value: Arc<T>) {
        match self.0.write() {
            Ok(mut guard) => *guard = value,
            Err(poisoned) => *poisoned.into_inner() = value,
        }
    }
}
