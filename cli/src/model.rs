//! `--model provider:MODEL`: the real model an embedded run decides with.

use std::sync::Arc;

use agentloop_decision::{Model, ModelConfig, Price, PricedModel};
use anyhow::Context;

/// Builds the adapter for `spec` (`openai:MODEL` or `anthropic:MODEL`), with the base
/// URL and key from the ecosystem's usual environment variables, priced at `price` if
/// given (`--price`). The key is never printed: the adapter's `Debug` redacts it.
pub(crate) fn from_spec(spec: &str, price: Option<Price>) -> anyhow::Result<Arc<dyn Model>> {
    let model = ModelConfig::from_spec(spec)
        .and_then(|config| config.build())
        .with_context(|| format!("--model {spec}"))?;
    Ok(match price {
        Some(price) => Arc::new(PricedModel::new(model, price)),
        None => model,
    })
}
