//! How a hook's run shows in the events: one `hook.result` per hook, and a
//! `HOOK_FAILED` warning for each that failed.

use crate::codes::WarningCode;
use crate::emitter::EventEmitter;
use crate::event::{EventKind, TurnIds};

use super::{HookEvent, HookReport};

/// Emits what the hooks of `event` did (`call_id` for tool events).
pub(crate) fn report(
    events: &EventEmitter,
    turn: &TurnIds,
    event: HookEvent,
    call_id: Option<&str>,
    reports: &[HookReport],
) {
    for report in reports {
        events.emit(
            turn,
            EventKind::HookResult {
                hook_event: event,
                hook: report.hook.clone(),
                call_id: call_id.map(str::to_string),
                decision: report.verdict,
                reason: report.reason.clone(),
                arguments_rewritten: report.rewrote_arguments,
                context: report.context.clone(),
                error: report.error.clone(),
                duration_ms: report.duration_ms,
            },
        );
        if let Some(error) = &report.error {
            events.emit(
                turn,
                EventKind::Warning {
                    code: WarningCode::HookFailed,
                    message: format!(
                        "the {event} hook `{}` failed: {error}; the run goes on as if it had not run",
                        report.hook
                    ),
                },
            );
        }
    }
}
