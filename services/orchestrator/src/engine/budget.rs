//! Usage and budgets: every model call's tokens (the backend's usage, else
//! the estimate) and cost (from `budget.prices`) add to the frame's meter and
//! to the turn's; a frame stops with [`super::Outcome::Budget`] when its
//! sub-turn, turn or session ceiling is reached.

use crate::config::BudgetConfig;
use omicos_history::{HistoryItem, Usage};
use omicos_proto::TurnUsage;
use std::sync::{Arc, Mutex};

/// Tokens, cost and model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Meter {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
    /// Cost in the units of the price table.
    pub cost: f64,
    /// Model calls.
    pub calls: u32,
}

impl Meter {
    /// Input plus output tokens.
    pub fn tokens(&self) -> u64 {
        self.input + self.output
    }

    /// Adds one model call.
    pub fn add(&mut self, other: &Meter) {
        self.input += other.input;
        self.output += other.output;
        self.cost += other.cost;
        self.calls += other.calls;
    }

    /// One call of `model`, priced from `cfg`.
    pub fn call(cfg: &BudgetConfig, model: &str, input: u64, output: u64) -> Meter {
        let cost = cfg.prices.get(model).map_or(0.0, |p| {
            (input as f64 * p.input_per_mtok + output as f64 * p.output_per_mtok) / 1e6
        });
        Meter {
            input,
            output,
            cost,
            calls: 1,
        }
    }

    /// As stored on an assistant message (`usage`), so a session's totals
    /// can be summed from its history on any replica.
    pub fn to_usage(&self) -> Usage {
        Usage::new(self.input, self.output, self.cost)
    }

    /// The session's usage so far: the sum of the `usage` of its assistant messages.
    pub fn of_history(history: &[HistoryItem]) -> Meter {
        let mut m = Meter::default();
        for u in history.iter().filter_map(|m| match m {
            HistoryItem::Assistant(a) => a.usage.as_ref(),
            _ => None,
        }) {
            m.input += u.input_tokens;
            m.output += u.output_tokens;
            m.cost += u.cost();
            m.calls += 1;
        }
        m
    }
}

/// The meters a frame adds to, shared by a root turn and its sub-turns.
#[derive(Clone, Debug, Default)]
pub struct Meters {
    /// The whole root turn, sub-turns included.
    pub turn: Arc<Mutex<Meter>>,
    /// The session before this turn.
    pub session_before: Meter,
}

impl Meters {
    /// The turn's usage summary for turn_done.
    pub fn summary(&self) -> TurnUsage {
        let t = *self.turn.lock().expect("turn meter");
        let mut s = self.session_before;
        s.add(&t);
        TurnUsage {
            input_tokens: t.input,
            output_tokens: t.output,
            cost: t.cost,
            model_calls: t.calls,
            session_input_tokens: s.input,
            session_output_tokens: s.output,
            session_cost: s.cost,
        }
    }

    /// Which ceiling is reached, if any, for a frame that used `frame` so far
    /// (`sub_turn`: the frame is a call_agent sub-turn).
    pub fn exhausted(&self, cfg: &BudgetConfig, frame: &Meter, sub_turn: bool) -> Option<String> {
        let turn = *self.turn.lock().expect("turn meter");
        let mut session = self.session_before;
        session.add(&turn);
        let checks: [(&str, bool, u64, u64, f64, f64); 3] = [
            (
                "sub-turn",
                sub_turn,
                cfg.sub_turn_tokens,
                frame.tokens(),
                cfg.sub_turn_cost,
                frame.cost,
            ),
            (
                "turn",
                true,
                cfg.turn_tokens,
                turn.tokens(),
                cfg.turn_cost,
                turn.cost,
            ),
            (
                "session",
                true,
                cfg.session_tokens,
                session.tokens(),
                cfg.session_cost,
                session.cost,
            ),
        ];
        for (what, applies, max_tokens, used_tokens, max_cost, used_cost) in checks {
            if !applies {
                continue;
            }
            if max_tokens > 0 && used_tokens >= max_tokens {
                return Some(format!(
                    "the {what} token budget is spent: {used_tokens} of {max_tokens} tokens used (budget.{}_tokens)",
                    what.replace('-', "_")
                ));
            }
            if max_cost > 0.0 && used_cost >= max_cost {
                return Some(format!(
                    "the {what} cost budget is spent: {used_cost:.4} of {max_cost:.4} used (budget.{}_cost)",
                    what.replace('-', "_")
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Price;
    use serde_json::json;

    #[test]
    fn cost_comes_from_the_price_table_and_each_ceiling_names_itself() {
        let mut cfg = BudgetConfig::default();
        cfg.prices.insert(
            "m".into(),
            Price {
                input_per_mtok: 2.0,
                output_per_mtok: 10.0,
            },
        );
        let c = Meter::call(&cfg, "m", 1_000_000, 100_000);
        assert!((c.cost - 3.0).abs() < 1e-9);
        assert_eq!(Meter::call(&cfg, "other", 5, 5).cost, 0.0);
        let meters = Meters::default();
        meters.turn.lock().unwrap().add(&c);
        assert_eq!(meters.exhausted(&cfg, &c, true), None);
        cfg.sub_turn_tokens = 1000;
        assert!(
            meters.exhausted(&cfg, &c, false).is_none(),
            "a root frame has no sub-turn ceiling"
        );
        let why = meters.exhausted(&cfg, &c, true).unwrap();
        assert!(
            why.contains("sub-turn token budget") && why.contains("budget.sub_turn_tokens"),
            "{why}"
        );
        cfg.turn_cost = 2.5;
        let why = meters.exhausted(&cfg, &Meter::default(), false).unwrap();
        assert!(why.contains("turn cost budget"), "{why}");
    }

    #[test]
    fn the_session_sums_the_usage_kept_on_assistant_messages() {
        let history: Vec<HistoryItem> = [
            json!({"role": "user", "content": "x"}),
            json!({"role": "assistant", "content": "a", "usage": {"input_tokens": 10, "output_tokens": 2, "cost": 0.5}}),
            json!({"role": "assistant", "content": "b", "usage": {"input_tokens": 5, "output_tokens": 1, "cost": 0.25}}),
        ]
        .into_iter()
        .map(HistoryItem::from_value)
        .collect();
        let m = Meter::of_history(&history);
        assert_eq!((m.input, m.output, m.calls), (15, 3, 2));
        assert!((m.cost - 0.75).abs() < 1e-9);
    }
}
