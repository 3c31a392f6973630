//! Safe handles over adaptor tables: every call returns a `Result` naming the adaptor, the
//! operation, the status and the adaptor's own message.

mod ccl;
mod device;
mod error;
mod options;

pub use ccl::{Ccl, RuntimeSupport};
pub use device::{Device, DeviceGraph, Graph, Properties};
pub use error::AdaptorError;
