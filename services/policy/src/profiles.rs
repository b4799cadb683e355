//! The policy set of each profile: loaded from files at start, reloaded when the files
//! change or on SIGHUP, swapped whole, never half.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use agentloop_authz::{Authorizer, Cedar, LoadError, Source, ToolFacts};
use agentloop_proto::v1::{SideEffect, ToolDescriptor};

use crate::error::PolicyError;

/// The tools as authorization sees them.
pub fn tool_facts(descriptors: &[ToolDescriptor]) -> Vec<ToolFacts<'_>> {
    descriptors
        .iter()
        .map(|descriptor| ToolFacts {
            name: &descriptor.name,
            side_effect: match descriptor.side_effect() {
                SideEffect::ReadOnly => "read_only",
                SideEffect::IdempotentWrite => "idempotent_write",
                // Undeclared is treated as the most dangerous kind, as everywhere.
                SideEffect::Write | SideEffect::Unspecified => "write",
            },
            requires_approval: descriptor.requires_approval,
            input_schema: &descriptor.input_schema_json,
        })
        .collect()
}

/// Reads and compiles the policy files `paths` for the tools `descriptors`: what the
/// service loads for a profile, and what `agentloop policy` checks.
///
/// # Errors
///
/// [`LoadError`] for a file that cannot be read, a policy that does not parse or does
/// not validate.
pub fn compile_policies(
    paths: &[PathBuf],
    descriptors: &[ToolDescriptor],
) -> Result<Cedar, LoadError> {
    Cedar::load(paths, &tool_facts(descriptors))
}

/// What a profile's policies say about a call, through [`Profiles::get`].
#[derive(Debug, Clone)]
pub enum ProfilePolicies {
    /// No policies are configured at all: authorization is off, and every call that
    /// passes the schemas and gates is allowed (the service warns at start).
    Off,
    /// The profile's policy set.
    On(Arc<Cedar>),
    /// Policies are configured, but not for this profile: every call is refused.
    Missing,
}

/// The policy sets of every profile, as last loaded successfully.
#[derive(Debug)]
pub struct Profiles {
    files: BTreeMap<String, Vec<PathBuf>>,
    /// The tools the sets are compiled for; replaced by [`Profiles::set_tools`].
    tools: RwLock<Arc<Vec<ToolDescriptor>>>,
    current: RwLock<Arc<BTreeMap<String, Arc<Cedar>>>>,
    /// Held while compiling, so a reload and a change of tools cannot swap in sets
    /// compiled for each other's inputs.
    compiling: Mutex<()>,
    /// How many reloads swapped a new set in, for whoever waits for one.
    swaps: tokio::sync::watch::Sender<u64>,
}

impl Profiles {
    /// Loads every profile's files (`profile → policy files`) for `tools`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Policies`] naming the profile and what is wrong.
    pub fn load(
        files: BTreeMap<String, Vec<PathBuf>>,
        tools: Vec<ToolDescriptor>,
    ) -> Result<Profiles, PolicyError> {
        let sets = compile_all(&files, &tools, &BTreeMap::new())?;
        Ok(Profiles {
            files,
            tools: RwLock::new(Arc::new(tools)),
            current: RwLock::new(Arc::new(sets)),
            compiling: Mutex::new(()),
            swaps: tokio::sync::watch::Sender::new(0),
        })
    }

    /// No policies: authorization off.
    pub fn off() -> Profiles {
        Profiles {
            files: BTreeMap::new(),
            tools: RwLock::default(),
            current: RwLock::new(Arc::new(BTreeMap::new())),
            compiling: Mutex::new(()),
            swaps: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The number of reloads that swapped a changed set in, as it grows.
    pub fn swaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.swaps.subscribe()
    }

    /// Whether no policies are configured (authorization off).
    pub fn is_off(&self) -> bool {
        self.files.is_empty()
    }

    /// The policies `profile` is judged by.
    pub fn get(&self, profile: &str) -> ProfilePolicies {
        if self.is_off() {
            return ProfilePolicies::Off;
        }
        match self.in_force().get(profile) {
            Some(set) => ProfilePolicies::On(Arc::clone(set)),
            None => ProfilePolicies::Missing,
        }
    }

    /// The version of each profile's policy set.
    pub fn versions(&self) -> BTreeMap<String, String> {
        self.in_force()
            .iter()
            .map(|(profile, set)| (profile.clone(), set.version().to_owned()))
            .collect()
    }

    /// The sets in force. A panic mid-swap cannot leave a half-written map (the swap is
    /// one store), so a poisoned lock still holds a whole one.
    fn in_force(&self) -> Arc<BTreeMap<String, Arc<Cedar>>> {
        match self.current.read() {
            Ok(sets) => Arc::clone(&sets),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Reads the files again and, if any changed, compiles them and swaps the sets in.
    /// Returns whether anything changed. A failure keeps the sets in force.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Policies`] when a changed file does not load.
    pub fn reload(&self) -> Result<bool, PolicyError> {
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.in_force();
        let tools = self.tools();
        let sets = compile_all(&self.files, &tools, &current)?;
        let changed = sets.iter().any(|(profile, set)| {
            current
                .get(profile)
                .is_none_or(|old| !Arc::ptr_eq(old, set))
        });
        if changed {
            self.swap(sets);
        }
        Ok(changed)
    }

    /// Compiles every profile's policies for `tools` (the gateway's registry changed)
    /// and swaps them in, with the tools. A failure keeps the sets and tools in force.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Policies`] when a profile's files do not load for these tools.
    pub fn set_tools(&self, tools: Vec<ToolDescriptor>) -> Result<(), PolicyError> {
        if self.is_off() {
            return Ok(());
        }
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let sets = compile_all(&self.files, &tools, &BTreeMap::new())?;
        *self.tools.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tools);
        self.swap(sets);
        Ok(())
    }

    fn tools(&self) -> Arc<Vec<ToolDescriptor>> {
        self.tools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn swap(&self, sets: BTreeMap<String, Arc<Cedar>>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(sets);
        self.swaps.send_modify(|swaps| *swaps += 1);
    }
}

/// Compiles every profile's files, logging each set compiled; a profile whose sources
/// are those of its set in `current` keeps that set (same version, no recompile).
fn compile_all(
    files: &BTreeMap<String, Vec<PathBuf>>,
    tools: &[ToolDescriptor],
    current: &BTreeMap<String, Arc<Cedar>>,
) -> Result<BTreeMap<String, Arc<Cedar>>, PolicyError> {
    let facts = tool_facts(tools);
    let mut sets = BTreeMap::new();
    for (profile, paths) in files {
        let failed = |error: LoadError| PolicyError::Policies {
            profile: profile.clone(),
            detail: error.to_string(),
        };
        let sources = paths
            .iter()
            .map(|path| Source::read(path))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        let unchanged = current
            .get(profile)
            .filter(|set| set.version() == agentloop_authz::version_of(&sources));
        let set = match unchanged {
            Some(set) => Arc::clone(set),
            None => {
                let set = Cedar::compile(&sources, &facts).map_err(failed)?;
                tracing::info!(profile, version = set.version(), "policies loaded");
                if !set.left_out().is_empty() {
                    tracing::warn!(profile, arguments = ?set.left_out(), "tools type these arguments differently; policies cannot read them");
                }
                Arc::new(set)
            }
        };
        sets.insert(profile.clone(), set);
    }
    Ok(sets)
}

/// Reloads `profiles` whenever a file changed, polling every `every`, and on SIGHUP
/// with `on_hangup`, for as long as it is polled. A reload that fails is logged and the
/// sets in force stay.
pub(crate) async fn watch(profiles: Arc<Profiles>, every: Option<Duration>, on_hangup: bool) {
    #[cfg(unix)]
    let mut hangups = if on_hangup {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP; policies reload on change only");
                None
            }
        }
    } else {
        None
    };
    let mut ticks = every.map(tokio::time::interval);
    loop {
        let hangup = async {
            #[cfg(unix)]
            if let Some(hangups) = hangups.as_mut() {
                hangups.recv().await;
                return;
            }
            std::future::pending::<()>().await;
        };
        let tick = async {
            match ticks.as_mut() {
                Some(ticks) => {
                    ticks.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = hangup => {}
            () = tick => {}
        }
        let profiles = Arc::clone(&profiles);
        // Reading and compiling is blocking work.
        let reloaded = tokio::task::spawn_blocking(move || {
            profiles
                .reload()
                .map(|changed| (changed, profiles.versions()))
        })
        .await;
        match reloaded {
            Ok(Ok((true, versions))) => tracing::info!(?versions, "policies reloaded"),
            Ok(Ok((false, _))) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "policies not reloaded; the policies in force stay");
            }
            Err(error) => tracing::warn!(%error, "policy reload failed"),
        }
    }
}
