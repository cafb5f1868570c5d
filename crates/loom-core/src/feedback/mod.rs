//! Chain-of-thought feedback (docs/context.md): the recursion monitor and the
//! guidance written between turns.

mod guidance;
mod monitor;

pub use guidance::{analyze, DefaultGuidance, GuidanceReason, ResultAnalysis, TaskHandler};
pub use monitor::{MonitorConfig, MonitorReport, RecursionMonitor, Stop, Termination, MAX_ITERATIONS_MESSAGE};
