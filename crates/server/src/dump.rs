//! `--dump-config`: the effective configuration as TOML, with the secrets a
//! configuration can hold taken out.
//!
//! agentloop configurations hold no key values (only the *names* of the variables that
//! hold API keys), but a URL can carry a password: `database_url`
//! (`postgres://user:password@host/db`, or `?password=`), `workers.redis_url`
//! (`redis://:password@host`), an endpoint or `base_url` behind an authenticating
//! proxy. Every string value that is a URL is therefore checked, whatever its key, so
//! a field added later is covered without anyone remembering to list it.

use serde::Serialize;
use toml::Value;

/// What a redacted password reads as. It keeps the URL a URL, so the dump still parses
/// and validates; used as a real password it fails to authenticate, visibly.
pub(crate) const REDACTED: &str = "REDACTED";

/// `config` as a TOML document, headed by a comment that names `service` and says
/// what was redacted. Keys come out sorted, tables after plain values.
pub(crate) fn to_toml<C: Serialize>(service: &str, config: &C) -> Result<String, toml::ser::Error> {
    let mut value = Value::try_from(config)?;
    redact(&mut value);
    let body = toml::to_string(&value)?;
    Ok(format!(
        "# {service}: effective configuration (defaults, file, environment, flags).\n\
         # URL passwords are shown as {REDACTED}.\n{body}"
    ))
}

/// Redacts every URL in `value`, at any depth.
fn redact(value: &mut Value) {
    match value {
        Value::String(text) => {
            if let Some(redacted) = redact_url(text) {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::Table(table) => table.iter_mut().for_each(|(_, item)| redact(item)),
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
    }
}

/// `text` with its password replaced by [`REDACTED`], or `None` when it is not a URL
/// (`scheme://…`) or holds no password.
///
/// The password is what follows the first `:` of the user info, which ends at the
/// *last* `@`: a password with an unescaped `/`, `?`, `#` or `@` is still hidden. The
/// price is that an `@` later in the URL (in a path or query) hides more than the
/// password; for a dump, hiding too much is the safe mistake. Query parameters whose
/// name contains `password`, `secret` or `token` (PostgreSQL takes `?password=` and
/// `?sslpassword=`) are redacted too.
fn redact_url(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let is_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !is_scheme {
        return None;
    }
    let (mut rest, mut changed) = match rest.rsplit_once('@') {
        Some((userinfo, host_and_path)) => match userinfo.split_once(':') {
            Some((user, _password)) => (format!("{user}:{REDACTED}@{host_and_path}"), true),
            None => (rest.to_owned(), false),
        },
        None => (rest.to_owned(), false),
    };
    if let Some(start) = rest.find('?') {
        let end = rest[start..].find('#').map_or(rest.len(), |at| start + at);
        let query = rest[start + 1..end]
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_parameter(name) => {
                    changed = true;
                    format!("{name}={REDACTED}")
                }
                Some(_) | None => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&");
        rest.replace_range(start + 1..end, &query);
    }
    changed.then(|| format!("{scheme}://{rest}"))
}

fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_redacted() {
        for (url, redacted) in [
            (
                "postgres://ledger:s3cret@db.internal:6543/effects",
                "postgres://ledger:REDACTED@db.internal:6543/effects",
            ),
            (
                "redis://:s3cret@cache:6379/0",
                "redis://:REDACTED@cache:6379/0",
            ),
            (
                "https://u:pa/ss@w#rd@proxy.example/v1",
                "https://u:REDACTED@proxy.example/v1",
            ),
            (
                "postgresql://db/effects?sslmode=require&password=s3cret&sslpassword=x#f",
                "postgresql://db/effects?sslmode=require&password=REDACTED&sslpassword=REDACTED#f",
            ),
            (
                "http://a:b@h/p?api_token=t",
                "http://a:REDACTED@h/p?api_token=REDACTED",
            ),
        ] {
            assert_eq!(redact_url(url).as_deref(), Some(redacted), "{url}");
        }
    }

    #[test]
    fn other_strings_are_left_alone() {
        for text in [
            "http://127.0.0.1:50052",
            "postgres://ledger@db/effects",
            "https://host/path?page=2",
            "data/ledger",
            "not a url: a:b@c",
            "://a:b@c",
            "1http://a:b@c",
            "",
        ] {
            assert_eq!(redact_url(text), None, "{text}");
        }
    }

    #[derive(Serialize)]
    struct Nested {
        url: String,
        urls: Vec<String>,
        inner: Inner,
        count: u32,
    }

    #[derive(Serialize)]
    struct Inner {
        redis_url: Option<String>,
    }

    #[test]
    fn the_dump_redacts_at_any_depth_and_says_so() {
        let dump = to_toml(
            "agentloop-test",
            &Nested {
                url: "postgres://u:one@h/d".into(),
                urls: vec!["http://h".into(), "http://u:two@h".into()],
                inner: Inner {
                    redis_url: Some("redis://:three@h".into()),
                },
                count: 3,
            },
        )
        .unwrap();
        for secret in ["one", "two", "three"] {
            assert!(!dump.contains(secret), "{dump}");
        }
        assert!(
            dump.starts_with("# agentloop-test: effective configuration"),
            "{dump}"
        );
        let parsed: toml::Table = toml::from_str(&dump).unwrap();
        assert_eq!(parsed["url"].as_str(), Some("postgres://u:REDACTED@h/d"));
        assert_eq!(
            parsed["inner"]["redis_url"].as_str(),
            Some("redis://:REDACTED@h")
        );
        assert_eq!(parsed["count"].as_integer(), Some(3));
    }
}
