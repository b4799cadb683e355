//! Layered configuration, the same for every service.
//!
//! Layers, each overriding the one before:
//!
//! 1. `T::default()` — a service runs with no configuration at all;
//! 2. a TOML file, if one is named (a named file that does not exist is an error, not
//!    silently skipped: a typo in `--config` must not start a service on defaults);
//! 3. environment variables `<PREFIX><KEY>`, matched case-insensitively, with `__`
//!    separating nested keys (`AGENTLOOP_LEDGER_STORE__BUSY_TIMEOUT_MS=5000` sets
//!    `store.busy_timeout_ms`); values are parsed as TOML-like scalars;
//! 4. `overrides`, usually the command-line flags.
//!
//! `<PREFIX>CONFIG` is not a key: it names the file of layer 2 (see
//! [`Service::start`](crate::Service::start)), so this layer skips it instead of failing
//! on an unknown key `config`.
//!
//! **`overrides`** is a serde struct whose fields are `Option`s, usually the flags. A
//! field that is `None` (a flag the user did not give) is left out before the layer is
//! merged, so it never clobbers a lower layer.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why configuration could not be loaded. The message names the offending key and the
/// layer it came from, so an operator can fix it without reading code.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config` named a file that does not exist.
    #[error("configuration file {} does not exist", path.display())]
    MissingFile {
        /// The path as given.
        path: PathBuf,
    },
    /// A value has the wrong type or shape, a key is unknown (with
    /// `#[serde(deny_unknown_fields)]`), or the file is not valid TOML.
    #[error("invalid configuration key `{key}`: {message}")]
    Invalid {
        /// Dotted path of the key (`store.busy_timeout_ms`); empty for the whole
        /// document (e.g. a TOML syntax error).
        key: String,
        /// What is wrong and which layer supplied the value.
        message: String,
    },
}

impl From<figment::Error> for ConfigError {
    fn from(error: figment::Error) -> Self {
        // A top-level key no setting took, refused by `UnknownKeys` once the flattened
        // settings had taken theirs: figment knows no path there, serde knows the key.
        if let (true, figment::error::Kind::UnknownField(key, _)) =
            (error.path.is_empty(), &error.kind)
        {
            return ConfigError::Invalid {
                key: key.clone(),
                message: "unknown key".to_owned(),
            };
        }
        let key = error.path.join(".");
        let profile = error.profile.clone().unwrap_or_default();
        let keys: Vec<&str> = error.path.iter().map(String::as_str).collect();
        let source = error
            .metadata
            .as_ref()
            .map(|md| {
                let mut source = md.name.to_string();
                if let Some(origin) = &md.source {
                    source.push_str(&format!(" {origin}"));
                }
                if !keys.is_empty() {
                    source.push_str(&format!(", as `{}`", md.interpolate(&profile, &keys)));
                }
                source
            })
            .unwrap_or_else(|| "unknown source".to_owned());
        ConfigError::Invalid {
            key,
            message: format!("{} [from {source}]", error.kind),
        }
    }
}

/// Loads `T` from defaults, `file`, the process environment (variables starting with
/// `env_prefix`, e.g. `"AGENTLOOP_LEDGER_"`) and `overrides`; see the module docs.
///
/// Environment variables whose name or value is not valid UTF-8 are ignored.
pub fn load<T>(
    file: Option<&Path>,
    env_prefix: &str,
    overrides: impl Serialize,
) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    load_from(file, process_env(), env_prefix, overrides)
}

/// Key, below the prefix, of the variable that names the configuration file
/// (`AGENTLOOP_LEDGER_CONFIG`); never a configuration key.
pub(crate) const FILE_KEY: &str = "CONFIG";

/// The process environment, without variables whose name or value is not UTF-8.
pub fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)))
}

/// [`load`] with the environment passed in, so tests need not change the process
/// environment (which is global and racy under parallel tests).
pub fn load_from<T>(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    env_prefix: &str,
    overrides: impl Serialize,
) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
{
    Ok(layers::<T>(file, env, env_prefix, overrides)?.extract()?)
}

/// The layers of [`load_from`], merged and not yet extracted.
pub(crate) fn layers<T>(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    env_prefix: &str,
    overrides: impl Serialize,
) -> Result<Figment, ConfigError>
where
    T: Serialize + Default,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        if !path.is_file() {
            return Err(ConfigError::MissingFile {
                path: path.to_path_buf(),
            });
        }
        figment = figment.merge(Toml::file_exact(path));
    }
    Ok(figment
        .merge(EnvVars::new(env, env_prefix))
        .merge(Serialized::defaults(given(Value::serialize(overrides)?))))
}

/// `value` without its empty (`None`) fields, at any depth: what was not given.
fn given(value: Value) -> Value {
    let Value::Dict(tag, dict) = value else {
        return value;
    };
    let dict = dict
        .into_iter()
        .map(|(key, value)| (key, given(value)))
        .filter(|(_, value)| !matches!(value, Value::Empty(..)))
        .collect();
    Value::Dict(tag, dict)
}

/// A figment provider over a given list of environment variables: figment's own `Env`
/// always reads the process environment, which tests must not change.
struct EnvVars {
    prefix: String,
    /// (lower-cased dotted key without the prefix, raw value)
    vars: Vec<(String, String)>,
}

impl EnvVars {
    fn new(env: impl IntoIterator<Item = (String, String)>, prefix: &str) -> Self {
        let upper_prefix = prefix.to_ascii_uppercase();
        let vars = env
            .into_iter()
            .filter_map(|(key, value)| {
                let key = key.trim();
                let rest = key
                    .get(..upper_prefix.len())
                    .filter(|head| head.eq_ignore_ascii_case(&upper_prefix))
                    .and_then(|_| key.get(upper_prefix.len()..))?;
                let dotted = rest.to_ascii_lowercase().replace("__", ".");
                // Same rule as figment's `Env`: skip keys with an empty segment.
                if dotted.split('.').any(str::is_empty) || dotted.eq_ignore_ascii_case(FILE_KEY) {
                    return None;
                }
                Some((dotted, value))
            })
            .collect();
        Self {
            prefix: upper_prefix,
            vars,
        }
    }
}

impl Provider for EnvVars {
    fn metadata(&self) -> Metadata {
        let prefix = self.prefix.clone();
        Metadata::named(format!("environment variable(s) {prefix}*")).interpolater(
            move |_profile, keys| {
                let keys: Vec<_> = keys.iter().map(|k| k.to_ascii_uppercase()).collect();
                format!("{prefix}{}", keys.join("__"))
            },
        )
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (key, raw) in &self.vars {
            let Ok(value) = raw.parse::<Value>();
            insert_nested(&mut dict, &key.split('.').collect::<Vec<_>>(), value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Inserts `value` at the dotted path `keys`, creating (or replacing non-dictionary
/// values with) dictionaries on the way. With two variables for the same key the last
/// one wins, which only happens with differently-cased duplicates.
fn insert_nested(dict: &mut Dict, keys: &[&str], value: Value) {
    match keys {
        [] => {}
        [last] => {
            dict.insert((*last).to_owned(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry((*first).to_owned())
                .or_insert_with(|| Value::from(Dict::new()));
            if entry.as_dict().is_none() {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert_nested(inner, rest, value);
            }
        }
    }
}
