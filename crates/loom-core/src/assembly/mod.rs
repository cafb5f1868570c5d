//! Building the system prompt (seed 000's context assembly): components
//! with priorities under a token budget, project instructions, retrieval.

mod assembler;
mod instructions;

pub use assembler::{Assembled, ContextAssembler, ContextComponent, Priority};
pub use instructions::{load_project_instructions, ProjectInstructions, INSTRUCTION_FILES};
