//! The communicator's event pool: one event per sync point of a plan, taken back only once its
//! record has completed (`event_query`), so no wait ever observes a later record than the one
//! it was enqueued after. Events are made on demand and kept until the communicator goes.

use std::collections::VecDeque;

use crate::abi::{Event, Status};
use crate::adaptor::{AdaptorError, Device};

/// Events of one communicator: free ones, and recorded ones not yet known complete.
#[derive(Default)]
pub struct EventPool {
    free: Vec<Event>,
    recorded: VecDeque<Event>,
    made: usize,
}

/// Event flag: no timing (cheaper records).
const NO_TIMING: u32 = 1;

impl EventPool {
    /// An event whose last record (if any) has completed: a free one, the oldest recorded one
    /// that has completed, or a new one.
    pub fn take(&mut self, device: &Device) -> Result<Event, AdaptorError> {
        if let Some(e) = self.free.pop() {
            return Ok(e);
        }
        let query = device.tables().root.get().event_query;
        while let (Some(&e), Some(q)) = (self.recorded.front(), query) {
            // SAFETY: an event of this device, not destroyed (the pool owns it).
            if unsafe { q(e) } != Status::SUCCESS {
                break;
            }
            self.recorded.pop_front();
            self.free.push(e);
        }
        if let Some(e) = self.free.pop() {
            return Ok(e);
        }
        let e = device.event_create(NO_TIMING)?;
        self.made += 1;
        Ok(e)
    }

    /// Gives back an event just recorded (it is taken again once the record completed).
    pub fn recorded(&mut self, e: Event) {
        self.recorded.push_back(e);
    }

    /// Gives back an event that was not recorded.
    pub fn unused(&mut self, e: Event) {
        self.free.push(e);
    }

    /// Events made so far (a bounded number: the plan's sync points in flight).
    pub fn made(&self) -> usize {
        self.made
    }

    /// Destroys every event (the streams they were recorded on are drained first).
    pub fn destroy(&mut self, device: &Device) {
        for e in self.free.drain(..).chain(self.recorded.drain(..)) {
            let _ = device.event_destroy(e);
        }
    }
}
