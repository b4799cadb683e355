//! The price table: what a model's tokens cost, so each decision reports its cost next to
//! its token usage and the engine can hold an invocation to a cost budget.
//!
//! Prices are configured in US dollars per million tokens, as providers publish them, and
//! held as whole micro-dollars ([`MicroUsd`]): the decimal text is parsed exactly, never
//! rounded through a float. A model without an entry reports no cost at all (not a cost
//! of zero), so a cost budget can tell "free" from "unknown" and refuse the latter.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use agentloop_engine::{MicroUsd, Usage};
use agentloop_proto::v1::ToolDescriptor;
use serde::{Deserialize, Serialize};

use crate::model::{Model, ModelError, ModelReply, Question};

/// Tokens in the unit prices are quoted for.
const TOKENS_PER_PRICE_UNIT: u128 = 1_000_000;

/// One model's entry in the price table (`[prices."MODEL"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// US dollars per million input (prompt) tokens, e.g. `2.50`.
    #[serde(with = "usd_text")]
    pub input_usd_per_mtok: MicroUsd,
    /// US dollars per million output (completion) tokens, e.g. `10.00`.
    #[serde(with = "usd_text")]
    pub output_usd_per_mtok: MicroUsd,
}

impl Price {
    /// What `usage` costs at this price, rounded up to the next micro-dollar, so that many
    /// small calls can never add up to less than they cost. Saturates instead of wrapping.
    pub fn cost(&self, usage: &Usage) -> MicroUsd {
        let micro_usd_per_mtok = u128::from(usage.input_tokens)
            * u128::from(self.input_usd_per_mtok.0)
            + u128::from(usage.output_tokens) * u128::from(self.output_usd_per_mtok.0);
        let micros = micro_usd_per_mtok.div_ceil(TOKENS_PER_PRICE_UNIT);
        MicroUsd(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

/// `INPUT,OUTPUT` in US dollars per million tokens (`2.50,10`): the command line's form.
impl FromStr for Price {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (input, output) = text.split_once(',').ok_or_else(|| {
            format!("{text:?} is not INPUT,OUTPUT in US dollars per million tokens, like 2.50,10")
        })?;
        Ok(Price {
            input_usd_per_mtok: input.parse().map_err(|e| format!("input price: {e}"))?,
            output_usd_per_mtok: output.parse().map_err(|e| format!("output price: {e}"))?,
        })
    }
}

/// A model whose replies carry their cost at `price`; built around every configured model
/// that has an entry in the price table.
#[derive(Debug)]
pub struct PricedModel {
    model: Arc<dyn Model>,
    price: Price,
}

impl PricedModel {
    /// `model`, priced at `price`.
    pub fn new(model: Arc<dyn Model>, price: Price) -> PricedModel {
        PricedModel { model, price }
    }
}

#[async_trait::async_trait]
impl Model for PricedModel {
    fn reads(&self) -> crate::model::Reads {
        self.model.reads()
    }

    fn provider(&self) -> &'static str {
        self.model.provider()
    }

    fn request_model(&self) -> &str {
        self.model.request_model()
    }

    async fn decide_with(
        &self,
        question: &Question<'_>,
        tools: &[ToolDescriptor],
    ) -> Result<ModelReply, ModelError> {
        let mut reply = self.model.decide_with(question, tools).await?;
        reply.usage.cost = Some(self.price.cost(&reply.usage));
        Ok(reply)
    }
}

/// Dollar amounts in configuration: a TOML number (`2.5`, `3`) or a string (`"2.50"`),
/// read as decimal text. A float is only ever turned back into its shortest decimal
/// text, so `0.15` is exactly 150,000 micro-dollars; one with more decimals than a
/// micro-dollar is refused, not rounded.
mod usd_text {
    use super::{MicroUsd, fmt};
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(amount: &MicroUsd, s: S) -> Result<S::Ok, S::Error> {
        let text = amount.to_string();
        s.serialize_str(text.trim_start_matches('$'))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MicroUsd, D::Error> {
        d.deserialize_any(UsdVisitor)
    }

    struct UsdVisitor;

    impl UsdVisitor {
        fn parse<E: de::Error>(text: &str) -> Result<MicroUsd, E> {
            text.parse().map_err(E::custom)
        }
    }

    impl Visitor<'_> for UsdVisitor {
        type Value = MicroUsd;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an amount of US dollars, like 2.50 or \"2.50\"")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<MicroUsd, E> {
            Self::parse(&v.to_string())
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<MicroUsd, E> {
            Self::parse(&v.to_string())
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<MicroUsd, E> {
            Self::parse(&v.to_string())
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<MicroUsd, E> {
            Self::parse(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            cost: None,
        }
    }

    #[test]
    fn cost_is_tokens_times_price_per_million_rounded_up() {
        let price: Price = "2.50,10".parse().unwrap();
        assert_eq!(price.input_usd_per_mtok, MicroUsd(2_500_000));
        // 1,000 in at $2.50/M = 2,500 µ$; 200 out at $10/M = 2,000 µ$.
        assert_eq!(price.cost(&usage(1_000, 200)), MicroUsd(4_500));
        // 1 token at $0.15/M is 0.15 µ$: charged as 1, never as 0.
        let cheap: Price = "0.15,0.60".parse().unwrap();
        assert_eq!(cheap.cost(&usage(1, 0)), MicroUsd(1));
        assert_eq!(cheap.cost(&usage(0, 0)), MicroUsd(0));
        assert_eq!(price.cost(&usage(u64::MAX, u64::MAX)), MicroUsd(u64::MAX));
        for bad in ["2.5", "x,1", "1,-1", "1,0.0000001"] {
            assert!(bad.parse::<Price>().is_err(), "{bad}");
        }
    }

    #[test]
    fn config_prices_read_numbers_and_strings_exactly() {
        #[derive(Deserialize, Serialize)]
        struct Table {
            p: std::collections::BTreeMap<String, Price>,
        }
        let table: Table = toml::from_str(
            r#"
            [p."gpt-4o-mini"]
            input_usd_per_mtok = 0.15
            output_usd_per_mtok = "0.60"
            [p.whole]
            input_usd_per_mtok = 3
            output_usd_per_mtok = 15
            "#,
        )
        .unwrap();
        assert_eq!(
            table.p["gpt-4o-mini"],
            Price {
                input_usd_per_mtok: MicroUsd(150_000),
                output_usd_per_mtok: MicroUsd(600_000)
            }
        );
        assert_eq!(table.p["whole"].output_usd_per_mtok, MicroUsd(15_000_000));
        let again: Table = toml::from_str(&toml::to_string(&table).unwrap()).unwrap();
        assert_eq!(again.p, table.p);
        for bad in ["-1", "0.0000001", "\"free\"", "true"] {
            let text = format!("[p.m]\ninput_usd_per_mtok = {bad}\noutput_usd_per_mtok = 1");
            assert!(toml::from_str::<Table>(&text).is_err(), "{bad}");
        }
    }
}
