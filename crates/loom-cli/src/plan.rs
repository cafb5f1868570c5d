//! Plan mode on the terminal (docs/cli.md, "Permission modes"): what a
//! planning run is told, the approval asked once it has answered, and the
//! task of the run that carries an approved plan out.

use crate::lines::Lines;

/// What a run in plan mode is told: kept whole in its system prompt.
pub(crate) const INSTRUCTIONS: &str =
    "# Plan mode\n\nYou are in plan mode: investigate with the tools you have, which only read, and change nothing. \
Answer with a plan: the steps you would take, the files you would change and how, and what you are unsure of. \
A person reviews the plan; only once they approve it is it carried out.";

/// The task of the session's next run once a plan is approved.
pub(crate) const APPROVED: &str = "The plan is approved. Carry it out now.";

/// Whether the person approves the plan just shown: `--yes` does;
/// otherwise they are asked on the terminal (`lines`, the process's one
/// reader of stdin). A plan not approved says `not_approved`.
pub(crate) async fn approve(yes: bool, lines: &mut Lines, not_approved: &str) -> bool {
    if yes {
        say!("loom: --yes: carrying out the plan");
        return true;
    }
    say_partial!("loom: carry out this plan? [y/N]: ");
    lines.start();
    let approved = lines
        .recv()
        .await
        .is_some_and(|line| matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"));
    if !approved {
        say!("loom: the plan was not carried out; {not_approved}");
    }
    approved
}
