//! Safe handles over adaptor tables: every call returns a `Result` naming the adaptor, the
//! operation, the status and the adaptor's own message.

mod ccl;
mod device;
mod error;
mod options;

pub use crate::caps::{CclCaps, DeviceCaps, RuntimeSupport};
pub use ccl::Ccl;
pub use device::{Device, DeviceGraph, DeviceKernel, Function, Graph, Module, Properties};
pub use error::AdaptorError;
