//! The `Retriever` trait: documents relevant to a query, ranked.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One retrieved passage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedDoc {
    /// Where it comes from (a path, a URL, an id).
    pub source: String,
    /// The passage.
    pub content: String,
    /// Relevance; higher is better.
    pub score: f32,
}

/// A retriever failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("retrieval failed: {0}")]
pub struct RetrievalError(pub String);

/// Finds documents for a query.
#[async_trait]
pub trait Retriever: Send + Sync {
    /// At most `limit` passages for `query`, best first.
    async fn retrieve(&self, query: &str, limit: usize) -> Result<Vec<RetrievedDoc>, RetrievalError>;
}
