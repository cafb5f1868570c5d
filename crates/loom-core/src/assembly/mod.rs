//! Building the system prompt (docs/context.md): components
//! with priorities under a token budget, project instructions, retrieval.

mod assembler;
mod instructions;

pub use assembler::{Assembled, ContextAssembler, ContextComponent, Priority};
pub use instructions::{load_project_instructions, ProjectInstructions, INSTRUCTION_FILES};
