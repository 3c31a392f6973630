//! Safe handles over adaptor tables: every call returns a `Result` naming the adaptor, the
//! operation, the status and the adaptor's own message.
//!
//! # Valid ranges
//!
//! A call that takes a caller's address ([`Device::mem_copy`], every collective of [`Ccl`], …)
//! is an `unsafe fn`: the adaptor reads or writes there, and nothing can check the address. Its
//! `# Safety` section asks for *valid* ranges: `[ptr, ptr + bytes)` lies within one live
//! allocation of the device adaptor (from its `mem_alloc`, or mapped by its VMM, flat-map,
//! multicast or IPC entries; for a CCL, an allocation of the device its communicator was created
//! on), or within live memory of this process, for the device's own copies and memsets (the ABI's
//! unified addressing) and for any call on a device whose capabilities include
//! [`HOST_ADDRESSABLE`](crate::abi::Capabilities::HOST_ADDRESSABLE). Where the call enqueues work
//! on a stream, the ranges must stay valid until that work completes, and nothing else may write
//! them (nor read a range the call writes) in that time.
//!
//! [`DeviceBuffer`] is the safe way: it owns its allocation, frees it on drop, and checks bounds
//! on every copy.

mod buffer;
mod ccl;
mod device;
mod error;
mod options;

pub use crate::caps::{CclCaps, DeviceCaps, RuntimeSupport};
pub use buffer::DeviceBuffer;
pub use ccl::Ccl;
pub use device::{Device, DeviceGraph, DeviceKernel, Function, Graph, Module, Properties};
pub use error::AdaptorError;
