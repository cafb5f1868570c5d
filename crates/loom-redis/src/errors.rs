//! Redis errors as the store's errors.

use loom_core::StoreError;

/// A Redis error as a store's: `Unavailable` when Redis could not be
/// reached or did not answer (the same write may succeed once it is back).
pub(crate) fn backend(err: redis::RedisError) -> StoreError {
    if err.code() == Some("FENCED") {
        return StoreError::Fenced(fenced_run(&err));
    }
    if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() || err.is_timeout() {
        StoreError::Unavailable(format!("redis: {err}"))
    } else {
        StoreError::Backend(format!("redis: {err}"))
    }
}

/// The run a `FENCED` refusal names: its detail is the leased run's key,
/// `{prefix}run:{id}`.
pub(crate) fn fenced_run(err: &redis::RedisError) -> String {
    let key = err.detail().unwrap_or_default();
    key.split_once("run:").map_or(key, |(_, id)| id).to_string()
}
