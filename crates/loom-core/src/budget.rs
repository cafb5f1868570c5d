//! Budgets: the tokens and the money a run may spend (docs/context.md).
//! A run checks them before each turn: it is warned once a
//! budget is 80 % used and stops, `BUDGET_EXHAUSTED`, once one is used up.
//! A model call cannot be stopped halfway, so a run ends at most one call
//! past its budget.

use serde::{Deserialize, Serialize};

use crate::metrics::RunMetrics;

/// What a run may spend; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    /// Prompt and completion tokens over all model calls (compression
    /// summaries included): what a provider bills.
    pub max_tokens: Option<u64>,
    /// US dollars over all model calls, at the model's prices.
    pub max_cost_usd: Option<f64>,
}

/// Which budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    /// [`Budget::max_tokens`].
    Tokens,
    /// [`Budget::max_cost_usd`].
    Cost,
}

/// The share of a budget at which a run is warned.
pub const WARN_AT: f64 = 0.8;

/// How much of one budget a run has used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spending {
    /// Which budget.
    pub kind: BudgetKind,
    /// Used so far.
    pub spent: f64,
    /// The limit.
    pub limit: f64,
}

impl Spending {
    /// `spent / limit`.
    pub fn share(&self) -> f64 {
        if self.limit > 0.0 {
            self.spent / self.limit
        } else {
            f64::INFINITY
        }
    }

    /// "9 120 of 10 000 tokens", "$0.0412 of $0.0500".
    pub fn describe(&self) -> String {
        match self.kind {
            BudgetKind::Tokens => format!("{} of {} tokens", self.spent as u64, self.limit as u64),
            BudgetKind::Cost => format!("${:.4} of ${:.4}", self.spent, self.limit),
        }
    }
}

impl Budget {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.max_tokens.is_some() || self.max_cost_usd.is_some()
    }

    /// How much of each limited budget `metrics` shows used, tokens first.
    pub fn spending(&self, metrics: &RunMetrics) -> Vec<Spending> {
        let mut spending = Vec::new();
        if let Some(limit) = self.max_tokens {
            spending.push(Spending {
                kind: BudgetKind::Tokens,
                spent: metrics.input_tokens.saturating_add(metrics.output_tokens) as f64,
                limit: limit as f64,
            });
        }
        if let Some(limit) = self.max_cost_usd {
            spending.push(Spending {
                kind: BudgetKind::Cost,
                spent: metrics.cost_usd.unwrap_or(0.0),
                limit,
            });
        }
        spending
    }

    /// The first budget `metrics` has used up, if any.
    pub fn exhausted(&self, metrics: &RunMetrics) -> Option<Spending> {
        self.spending(metrics).into_iter().find(|spent| spent.share() >= 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(tokens: u64, cost: Option<f64>) -> RunMetrics {
        RunMetrics {
            input_tokens: tokens / 2,
            output_tokens: tokens - tokens / 2,
            cost_usd: cost,
            ..RunMetrics::default()
        }
    }

    #[test]
    fn a_budget_is_used_up_at_its_limit_and_not_before() {
        let budget = Budget {
            max_tokens: Some(1000),
            max_cost_usd: Some(0.05),
        };
        assert_eq!(budget.exhausted(&used(999, Some(0.01))), None);
        let tokens = budget.exhausted(&used(1000, Some(0.01))).unwrap();
        assert_eq!(tokens.kind, BudgetKind::Tokens);
        assert_eq!(tokens.describe(), "1000 of 1000 tokens");
        let cost = budget.exhausted(&used(10, Some(0.06))).unwrap();
        assert_eq!(cost.kind, BudgetKind::Cost);
        assert_eq!(cost.describe(), "$0.0600 of $0.0500");
        let spending = budget.spending(&used(800, Some(0.01)));
        assert!((spending[0].share() - 0.8).abs() < 1e-9);
        assert!(spending[1].share() < WARN_AT);
    }

    #[test]
    fn no_limit_is_never_used_up() {
        let budget = Budget::default();
        assert!(!budget.is_limited());
        assert_eq!(budget.exhausted(&used(u64::MAX, Some(1e9))), None);
    }
}

/// Tokens and money spent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

impl Spent {
    fn add(&mut self, other: Spent) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_usd += other.cost_usd;
    }

    fn as_metrics(self) -> RunMetrics {
        RunMetrics {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cost_usd: (self.cost_usd > 0.0).then_some(self.cost_usd),
            ..RunMetrics::default()
        }
    }
}

/// One run's place in its run tree's budgets: its own limits, what it and
/// its descendants spent (charged as each model call returns, so a child
/// that is aborted has already counted), and its parent's node. A run may
/// spend while neither its budget nor any ancestor's is used up.
#[derive(Debug)]
pub(crate) struct BudgetNode {
    budget: Budget,
    parent: Option<std::sync::Arc<BudgetNode>>,
    spent: std::sync::Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// This run and its descendants.
    total: Spent,
    /// Its descendants only.
    descendants: Spent,
    /// The part of `descendants` already added to the run's metrics.
    folded: Spent,
}

impl BudgetNode {
    /// The node of a top-level run.
    pub(crate) fn root(budget: Budget) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            budget,
            parent: None,
            spent: std::sync::Mutex::default(),
        })
    }

    /// The node of a child run with its own `budget` (the parent's remain
    /// in force above it).
    pub(crate) fn child(self: &std::sync::Arc<Self>, budget: Budget) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            budget,
            parent: Some(self.clone()),
            spent: std::sync::Mutex::default(),
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.spent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A resumed run's spending so far: its stored metrics (which hold what
    /// its sub-agents spent, too).
    pub(crate) fn seed(&self, metrics: &RunMetrics) {
        self.ledger().total = Spent {
            input_tokens: metrics.input_tokens,
            output_tokens: metrics.output_tokens,
            cost_usd: metrics.cost_usd.unwrap_or(0.0),
        };
    }

    /// One model call of this run: counted here and in every ancestor.
    pub(crate) fn charge(&self, input_tokens: u64, output_tokens: u64, cost_usd: f64) {
        let spent = Spent {
            input_tokens,
            output_tokens,
            cost_usd,
        };
        self.ledger().total.add(spent);
        let mut ancestor = self.parent.as_deref();
        while let Some(node) = ancestor {
            let mut ledger = node.ledger();
            ledger.total.add(spent);
            ledger.descendants.add(spent);
            drop(ledger);
            ancestor = node.parent.as_deref();
        }
    }

    /// Counts a descendant's earlier spending (a sub-agent resumed after a
    /// crash, or found ended) for this run and its ancestors.
    pub(crate) fn charge_descendant(&self, metrics: &RunMetrics) {
        let spent = Spent {
            input_tokens: metrics.input_tokens,
            output_tokens: metrics.output_tokens,
            cost_usd: metrics.cost_usd.unwrap_or(0.0),
        };
        let mut node = Some(self);
        while let Some(current) = node {
            let mut ledger = current.ledger();
            ledger.total.add(spent);
            ledger.descendants.add(spent);
            drop(ledger);
            node = current.parent.as_deref();
        }
    }

    /// What the run's descendants spent since the last call: to be added
    /// to the run's own metrics, so they show the whole subtree.
    pub(crate) fn take_descendants(&self) -> RunMetrics {
        let mut ledger = self.ledger();
        let delta = Spent {
            input_tokens: ledger.descendants.input_tokens - ledger.folded.input_tokens,
            output_tokens: ledger.descendants.output_tokens - ledger.folded.output_tokens,
            cost_usd: ledger.descendants.cost_usd - ledger.folded.cost_usd,
        };
        ledger.folded = ledger.descendants;
        delta.as_metrics()
    }

    /// How much of each budget is used, for this run and each ancestor
    /// (this run's first).
    pub(crate) fn spending(&self) -> Vec<Spending> {
        let mut spending = Vec::new();
        let mut node = Some(self);
        while let Some(current) = node {
            let total = current.ledger().total.as_metrics();
            spending.extend(current.budget.spending(&total));
            node = current.parent.as_deref();
        }
        spending
    }

    /// What a new child may spend at most: what is left of this run's
    /// budgets and its ancestors', the tightest of each kind.
    pub(crate) fn remaining(&self) -> Budget {
        let mut left = Budget::default();
        for spent in self.spending() {
            let rest = (spent.limit - spent.spent).max(0.0);
            match spent.kind {
                BudgetKind::Tokens => {
                    let rest = rest as u64;
                    left.max_tokens = Some(left.max_tokens.map_or(rest, |known| known.min(rest)));
                }
                BudgetKind::Cost => {
                    left.max_cost_usd = Some(left.max_cost_usd.map_or(rest, |known| known.min(rest)));
                }
            }
        }
        left
    }
}
