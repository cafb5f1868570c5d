//! `ContextAssembler`: components with a priority and a truncatable flag,
//! fitted into a token budget — the lowest priorities are cut or dropped
//! first, critical ones are always kept.

use crate::tokens::TokenCounter;

/// How much a component matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Always included, whatever the budget.
    Critical,
    /// Included before medium and low.
    High,
    /// Included before low.
    Medium,
    /// The first to go.
    Low,
}

/// One part of the system prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextComponent {
    /// A name for reports (`base`, `project_instructions`, …).
    pub name: String,
    /// The text.
    pub content: String,
    /// How much it matters.
    pub priority: Priority,
    /// Whether it may be cut short to fit.
    pub truncatable: bool,
}

impl ContextComponent {
    /// A component.
    pub fn new(name: &str, content: impl Into<String>, priority: Priority, truncatable: bool) -> Self {
        Self {
            name: name.to_string(),
            content: content.into(),
            priority,
            truncatable,
        }
    }
}

/// The assembled text and what happened to each component.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assembled {
    /// The system prompt.
    pub text: String,
    /// Its tokens: exact when the budget made counting necessary, else an
    /// upper bound (its bytes) that already fits the budget.
    pub tokens: usize,
    /// Components included whole.
    pub included: Vec<String>,
    /// Components cut short.
    pub truncated: Vec<String>,
    /// Components left out.
    pub dropped: Vec<String>,
}

/// Fits components into a budget.
#[derive(Debug)]
pub struct ContextAssembler<'a> {
    components: Vec<ContextComponent>,
    budget: usize,
    counter: &'a dyn TokenCounter,
}

/// Below this many tokens a cut component is not worth keeping.
const MIN_USEFUL_TOKENS: usize = 32;

impl<'a> ContextAssembler<'a> {
    /// An assembler with `budget` tokens.
    pub fn new(budget: usize, counter: &'a dyn TokenCounter) -> Self {
        Self {
            components: Vec::new(),
            budget,
            counter,
        }
    }

    /// Adds a component (empty ones are ignored).
    pub fn add(&mut self, component: ContextComponent) -> &mut Self {
        if !component.content.trim().is_empty() {
            self.components.push(component);
        }
        self
    }

    /// Chooses by priority, then joins the chosen parts in the order they were added.
    pub fn assemble(&self) -> Assembled {
        // Every token covers at least one byte: when the bytes fit, the
        // tokens do, and nothing needs tokenizing.
        let bytes: usize = self.components.iter().map(|c| c.content.len() + 2).sum();
        if bytes <= self.budget {
            let text = self
                .components
                .iter()
                .map(|c| c.content.as_str())
                .collect::<Vec<_>>()
                .join("\n\n");
            return Assembled {
                tokens: bytes,
                included: self.components.iter().map(|c| c.name.clone()).collect(),
                text,
                ..Assembled::default()
            };
        }
        let mut order: Vec<usize> = (0..self.components.len()).collect();
        order.sort_by_key(|&i| self.components[i].priority);
        let mut chosen: Vec<Option<String>> = vec![None; self.components.len()];
        let mut report = Assembled::default();
        let mut left = self.budget;
        for index in order {
            let component = &self.components[index];
            let tokens = self.counter.count_text(&component.content);
            if tokens <= left || component.priority == Priority::Critical {
                left = left.saturating_sub(tokens);
                chosen[index] = Some(component.content.clone());
                report.included.push(component.name.clone());
            } else if component.truncatable && left >= MIN_USEFUL_TOKENS {
                let cut = self.cut_to(&component.content, left);
                left = left.saturating_sub(self.counter.count_text(&cut));
                chosen[index] = Some(cut);
                report.truncated.push(component.name.clone());
            } else {
                report.dropped.push(component.name.clone());
            }
        }
        report.text = chosen.into_iter().flatten().collect::<Vec<_>>().join("\n\n");
        report.tokens = self.counter.count_text(&report.text);
        report
    }

    /// `text` cut (with a marker) to at most `tokens` tokens.
    fn cut_to(&self, text: &str, tokens: usize) -> String {
        const MARKER: &str = "\n[… cut to fit the context budget]";
        let budget = tokens.saturating_sub(self.counter.count_text(MARKER));
        let total = self.counter.count_text(text).max(1);
        let chars = text.chars().count();
        let mut keep = chars * budget / total;
        loop {
            let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
            let candidate = &text[..end];
            if keep == 0 || self.counter.count_text(candidate) <= budget {
                return format!("{candidate}{MARKER}");
            }
            keep = keep * 9 / 10;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::TiktokenCounter;

    #[test]
    fn the_lowest_priority_goes_first() {
        let counter = TiktokenCounter::for_model("gpt-4o");
        let words = |n: usize| "word ".repeat(n);
        let mut assembler = ContextAssembler::new(400, &counter);
        assembler
            .add(ContextComponent::new("base", words(100), Priority::Critical, false))
            .add(ContextComponent::new("project", words(150), Priority::High, true))
            .add(ContextComponent::new("retrieved", words(300), Priority::Medium, true))
            .add(ContextComponent::new("tools", words(200), Priority::Low, true));
        let out = assembler.assemble();
        assert_eq!(out.included, vec!["base", "project"]);
        assert_eq!(out.truncated, vec!["retrieved"]);
        assert_eq!(out.dropped, vec!["tools"]);
        assert!(out.tokens <= 410, "{}", out.tokens);
        assert!(out.text.contains("cut to fit"));

        let mut tight = ContextAssembler::new(50, &counter);
        tight
            .add(ContextComponent::new("base", words(100), Priority::Critical, false))
            .add(ContextComponent::new("low", words(10), Priority::Low, false));
        let out = tight.assemble();
        assert_eq!(out.included, vec!["base"], "critical is kept over budget");
        assert_eq!(out.dropped, vec!["low"]);
    }
}
