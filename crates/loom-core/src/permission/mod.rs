//! Permissions: the policy (`allow` / `ask` / `deny` rules) and the gate
//! that asks a person through the run's events and `RunHandle`.

mod gate;
mod grant;
mod mode;
mod policy;
mod sessions;

pub use crate::control::PermissionDecision;
pub(crate) use gate::{Ask, PendingAsks, PermissionGate};
pub use gate::{AskOutcome, SessionGrants};
pub use grant::SessionGrant;
pub use mode::{Mode, UnknownMode, FILE_WRITING_TOOLS};
pub use policy::{Decision, PermissionPolicy, PolicyError, Rule, Verdict};
pub(crate) use sessions::GrantsBySession;
