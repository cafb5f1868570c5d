//! Budgets: the tokens and the money a run may spend (seed 002's cost
//! budgets). A run checks them before each turn: it is warned once a
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
