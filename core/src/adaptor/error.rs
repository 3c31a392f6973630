//! Errors of calls through an adaptor's table.

use crate::abi::Status;

/// A call through an adaptor's table that failed or could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdaptorError {
    /// The entry returned a failure status.
    #[error("{adaptor}: {op} failed with {status}: {message}")]
    Failed {
        /// Adaptor name.
        adaptor: String,
        /// Entry called.
        op: &'static str,
        /// Status returned.
        status: Status,
        /// The adaptor's `get_last_error` message.
        message: String,
    },
    /// The entry is absent (`None`): the adaptor does not support the operation.
    #[error("{adaptor}: {op} is not supported (the table has no such entry)")]
    Unsupported {
        /// Adaptor name.
        adaptor: String,
        /// Entry wanted.
        op: &'static str,
    },
}

impl AdaptorError {
    /// The status code (`UNSUPPORTED` for an absent entry).
    pub fn status(&self) -> Status {
        match self {
            AdaptorError::Failed { status, .. } => *status,
            AdaptorError::Unsupported { .. } => Status::UNSUPPORTED,
        }
    }
}
