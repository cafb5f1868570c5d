//! `FolderRetriever`: ranked lexical search (BM25, from the `bm25` crate,
//! with stemming and stop words) over the text documents of a folder,
//! split into passages.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use bm25::{Language, SearchEngine, SearchEngineBuilder};
use loom_core::{RetrievalError, RetrievedDoc, Retriever};

/// Extensions of the files indexed.
const TEXT_EXTENSIONS: [&str; 10] = [
    "md", "markdown", "txt", "rst", "adoc", "org", "html", "toml", "yaml", "json",
];
/// Largest file indexed.
const MAX_FILE_BYTES: u64 = 2 * 1024 * 1024;
/// Passages are cut at paragraph breaks to about this many characters.
const PASSAGE_CHARS: usize = 1_200;

/// A BM25 index over a folder of documents.
pub struct FolderRetriever {
    root: PathBuf,
    sources: Vec<String>,
    engine: Mutex<SearchEngine<u32>>,
}

impl std::fmt::Debug for FolderRetriever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderRetriever")
            .field("root", &self.root)
            .field("passages", &self.sources.len())
            .finish()
    }
}

impl FolderRetriever {
    /// Reads and indexes the text files under `dir` (honouring `.gitignore`).
    /// Blocking: call it off the async threads.
    pub fn index(dir: &Path) -> Result<Self, RetrievalError> {
        let root = dir
            .canonicalize()
            .map_err(|err| RetrievalError(format!("cannot open {}: {err}", dir.display())))?;
        let mut sources = Vec::new();
        let mut passages = Vec::new();
        for entry in ignore::WalkBuilder::new(&root).require_git(false).build().flatten() {
            let path = entry.path();
            let is_text = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| TEXT_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
            let small = entry
                .metadata()
                .map(|m| m.is_file() && m.len() <= MAX_FILE_BYTES)
                .unwrap_or(false);
            if !is_text || !small {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let shown = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .to_string_lossy()
                .replace('\\', "/");
            for (number, passage) in split_passages(&text).into_iter().enumerate() {
                sources.push(format!("{shown}#{}", number + 1));
                passages.push(passage);
            }
        }
        let engine = SearchEngineBuilder::<u32>::with_corpus(Language::English, passages).build();
        Ok(Self {
            root,
            sources,
            engine: Mutex::new(engine),
        })
    }

    /// Passages indexed.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether nothing was indexed.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The best passages for `query`, best first.
    pub fn search(&self, query: &str, limit: usize) -> Vec<RetrievedDoc> {
        let engine = self.engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        engine
            .search(query, limit)
            .into_iter()
            .filter(|hit| hit.score > 0.0)
            .map(|hit| RetrievedDoc {
                source: self.sources.get(hit.document.id as usize).cloned().unwrap_or_default(),
                content: hit.document.contents,
                score: hit.score,
            })
            .collect()
    }
}

#[async_trait]
impl Retriever for FolderRetriever {
    async fn retrieve(&self, query: &str, limit: usize) -> Result<Vec<RetrievedDoc>, RetrievalError> {
        // An in-memory search: quick enough to run in place.
        Ok(self.search(query, limit))
    }
}

/// Paragraph-aligned passages of about `PASSAGE_CHARS` characters.
fn split_passages(text: &str) -> Vec<String> {
    let mut passages = Vec::new();
    let mut current = String::new();
    for paragraph in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        if !current.is_empty() && current.len() + paragraph.len() > PASSAGE_CHARS {
            passages.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push_str("\n\n");
        }
        current.push_str(paragraph);
    }
    if !current.is_empty() {
        passages.push(current);
    }
    passages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_the_relevant_passage_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("deploy.md"), "# Deploying\n\nRun the migrations before restarting the web servers.\n\nRollback uses the previous image tag.").unwrap();
        std::fs::write(
            dir.path().join("cooking.txt"),
            "Boil the pasta in salted water for ten minutes.",
        )
        .unwrap();
        std::fs::write(dir.path().join("binary.bin"), [0u8, 1, 2]).unwrap();
        let retriever = FolderRetriever::index(dir.path()).unwrap();
        assert_eq!(retriever.len(), 2);
        let hits = retriever.search("how do I roll back a deployment migration", 5);
        assert_eq!(hits[0].source, "deploy.md#1");
        assert!(hits[0].content.contains("migrations"));
        assert!(hits.iter().all(|h| !h.source.starts_with("cooking")), "{hits:?}");
        assert!(retriever.search("zzzz qqqq", 5).is_empty());
    }
}
