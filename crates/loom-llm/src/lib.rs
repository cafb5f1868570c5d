//! Model providers behind Loom's [`loom_core::Llm`] trait.
//!
//! This release ships the scripted model (DESIGN 4.6); the OpenAI-compatible
//! and Anthropic providers come next. [`model_from_spec`] turns a
//! `provider:model` string into a model.

#![warn(missing_docs)]

pub mod scripted;
mod spec;

pub use scripted::{ScriptError, ScriptToolCall, ScriptTurn, ScriptUsage, ScriptedModel};
pub use spec::{model_from_spec, ModelSpecError};
