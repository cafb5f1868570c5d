//! Showing a live run on the terminal: each event rendered, and the
//! permission questions it raises asked, in the order that keeps a settled
//! question's line ahead of anything printed after it. `loom run` and
//! `loom chat` both show runs with it; they differ only in what a signal
//! does to the run.

use loom::{Event, EventKind, RunController};

use crate::lines::Lines;
use crate::questions::Questions;
use crate::render::Renderer;

/// A run being shown.
pub(crate) struct Shown {
    renderer: Box<dyn Renderer>,
    questions: Questions,
    /// Writing failed once: nothing more is written.
    output_failed: bool,
}

impl Shown {
    pub(crate) fn new(renderer: Box<dyn Renderer>, questions: Questions) -> Self {
        Self {
            renderer,
            questions,
            output_failed: false,
        }
    }

    /// Shows `event`. The first failure to write output is returned, once;
    /// nothing is written after it (the caller stops the run).
    pub(crate) fn event(
        &mut self,
        controller: &RunController,
        event: &Event,
        lines: &mut Lines,
    ) -> Option<std::io::Error> {
        // A question the run settled ends its line before anything else is
        // printed; a new one is asked after its event.
        let settles = matches!(event.kind, EventKind::PermissionResolved { .. });
        if settles {
            self.questions.on_event(controller, event, lines);
        }
        let mut failed = None;
        if !self.output_failed {
            if let Err(err) = self.renderer.event(event) {
                self.output_failed = true;
                failed = Some(err);
            }
        }
        if !settles {
            self.questions.on_event(controller, event, lines);
        }
        failed
    }

    /// Whether a question waits for the person's line.
    pub(crate) fn asking(&self) -> bool {
        self.questions.waiting()
    }

    /// The person's answer to the question asked.
    pub(crate) fn answer(&mut self, controller: &RunController, line: Option<String>) {
        self.questions.on_line(controller, line);
    }
}
